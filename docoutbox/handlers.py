"""Handlers: pure functions from (state, message) to a new state and outgoing messages."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from docoutbox.errors import InvalidConfig, InvalidHandlerResult, UnknownMessageType
from docoutbox.model import Emit, Message

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True, init=False)
class Decision(Generic[S]):
    """What a handler decided: the new state and the messages to send with it."""

    state: S
    emits: tuple[Emit, ...]

    def __init__(self, state: S, *emits: Emit | Iterable[Emit]) -> None:
        if not isinstance(state, BaseModel):
            raise InvalidHandlerResult(
                f"a Decision's state must be a pydantic model, got {type(state).__name__}"
            )
        flat: list[Emit] = []
        for item in emits:
            if isinstance(item, Emit):
                flat.append(item)
                continue
            if isinstance(item, str | bytes | dict | BaseModel) or not isinstance(item, Iterable):
                raise InvalidHandlerResult(
                    f"a Decision takes Emit values (or iterables of them), got "
                    f"{type(item).__name__}; use docoutbox.emit()"
                )
            for sub in item:
                if not isinstance(sub, Emit):
                    raise InvalidHandlerResult(
                        f"a Decision takes Emit values, got {type(sub).__name__} in "
                        f"{type(item).__name__}; use docoutbox.emit()"
                    )
                flat.append(sub)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "emits", tuple(flat))


Handler = Callable[[S, Message], "S | Decision[S]"]


def check_result(result: object, model: type[S]) -> Decision[S]:
    """Normalize a handler's return value, rejecting anything but a state or Decision.

    The state must be exactly ``model``: a subclass would be stored with fields (or
    types) that ``model`` cannot read back.
    """
    decision: Decision[S]
    if type(result) is model:
        # The common case, a bare state: the Decision Decision(result) would make, built
        # without its argument checks (none of which can fail here).
        decision = object.__new__(Decision)
        decision.__dict__.update(state=result, emits=())
        return decision
    if isinstance(result, Decision):
        decision = result
    elif isinstance(result, BaseModel):
        decision = Decision(result)  # type: ignore[arg-type]
    else:
        raise InvalidHandlerResult(
            f"handler returned {type(result).__name__}; expected {model.__name__} or Decision"
        )
    if type(decision.state) is not model:
        raise InvalidHandlerResult(
            f"handler returned a state of type {type(decision.state).__name__}, "
            f"expected exactly {model.__name__}"
        )
    return decision


class Handlers(Generic[S]):
    """A registry of handlers by message type; itself a handler.

    >>> handlers: Handlers[Account] = Handlers()
    >>> @handlers.on("Deposit")
    ... def deposit(account: Account, message: Message) -> Account: ...
    """

    def __init__(self) -> None:
        self._by_type: dict[str, Handler[S]] = {}

    def on(self, *types: str) -> Callable[[Handler[S]], Handler[S]]:
        if not types:
            raise InvalidConfig("Handlers.on needs at least one message type")
        for name in types:
            if type(name) is not str or not name:
                raise InvalidConfig(f"a message type is a non-empty str, got {name!r}")

        def register(fn: Handler[S]) -> Handler[S]:
            if not callable(fn):
                raise InvalidConfig(f"a handler must be callable, got {type(fn).__name__}")
            for name in types:
                if name in self._by_type:
                    raise InvalidConfig(f"a handler for {name!r} is already registered")
            for name in types:
                self._by_type[name] = fn
            return fn

        return register

    def __call__(self, state: S, message: Message) -> S | Decision[S]:
        try:
            fn = self._by_type[message.type]
        except KeyError:
            raise UnknownMessageType(f"no handler for message type {message.type!r}") from None
        return fn(state, message)


def check_handling(handler: object, create: object) -> None:
    """``handle``'s ``handler`` (a :class:`Handlers` or a function: callable) and
    ``create`` (a bool: "no" is truthy)."""
    if not callable(handler):
        raise InvalidConfig(
            f"handler must be callable (a Handlers or a function), got {type(handler).__name__}"
        )
    if type(create) is not bool:
        raise InvalidConfig(f"create must be a bool, got {create!r}")
