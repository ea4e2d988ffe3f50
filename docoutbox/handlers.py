"""Handlers: pure functions from (state, message) to a new state and outgoing messages."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from docoutbox.errors import InvalidHandlerResult, UnknownMessageType
from docoutbox.model import Emit, Message

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True, init=False)
class Decision(Generic[S]):
    """What a handler decided: the new state and the messages to send with it."""

    state: S
    emits: tuple[Emit, ...]

    def __init__(self, state: S, *emits: Emit | Iterable[Emit]) -> None:
        flat: list[Emit] = []
        for item in emits:
            flat.extend([item] if isinstance(item, Emit) else item)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "emits", tuple(flat))


Handler = Callable[[S, Message], "S | Decision[S]"]


def check_result(result: object, model: type[S]) -> Decision[S]:
    """Normalize a handler's return value, rejecting anything but a state or Decision."""
    if isinstance(result, Decision):
        if not isinstance(result.state, model):
            raise InvalidHandlerResult(
                f"handler returned a Decision whose state is {type(result.state).__name__}, "
                f"expected {model.__name__}"
            )
        for item in result.emits:
            if not isinstance(item, Emit):
                raise InvalidHandlerResult(
                    f"handler emitted {type(item).__name__}; use docoutbox.emit()"
                )
        return result
    if isinstance(result, model):
        return Decision(result)
    raise InvalidHandlerResult(
        f"handler returned {type(result).__name__}; expected {model.__name__} or Decision"
    )


class Handlers(Generic[S]):
    """A registry of handlers by message type; itself a handler.

    >>> handlers: Handlers[Account] = Handlers()
    >>> @handlers.on("Deposit")
    ... def deposit(account: Account, message: Message) -> Account: ...
    """

    def __init__(self) -> None:
        self._by_type: dict[str, Handler[S]] = {}

    def on(self, *types: str) -> Callable[[Handler[S]], Handler[S]]:
        def register(fn: Handler[S]) -> Handler[S]:
            for name in types:
                if name in self._by_type:
                    raise ValueError(f"a handler for {name!r} is already registered")
                self._by_type[name] = fn
            return fn

        return register

    def __call__(self, state: S, message: Message) -> S | Decision[S]:
        try:
            fn = self._by_type[message.type]
        except KeyError:
            raise UnknownMessageType(f"no handler for message type {message.type!r}") from None
        return fn(state, message)
