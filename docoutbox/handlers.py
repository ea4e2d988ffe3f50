"""Handlers: pure functions from (state, message) to a new state and outgoing messages.

Rule: a handler is called with two arguments, ``(state, message)``, or with three,
``(state, message, context)``, when it accepts a third positional argument; which one is
decided once, by inspecting the handler, when it is registered (:meth:`Handlers.on`) or
first used, never per message. The :class:`Context` is built by the store from the
aggregate ID, the message's metadata and the store's clock, so a handler reading "now"
stays pure: the value comes from outside, and a test fixes it with ``StoreConfig.clock``.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from docoutbox.errors import InvalidConfig, InvalidHandlerResult, UnknownMessageType
from docoutbox.model import AggregateId, Cancel, Emit, Message

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True, init=False)
class Decision(Generic[S]):
    """What a handler decided: the new state, the messages to send with it, and the
    scheduled messages to cancel (:func:`~docoutbox.model.cancel`)."""

    state: S
    emits: tuple[Emit, ...]
    cancels: tuple[str, ...] = ()

    def __init__(self, state: S, *emits: Emit | Cancel | Iterable[Emit | Cancel]) -> None:
        if not isinstance(state, BaseModel):
            raise InvalidHandlerResult(
                f"a Decision's state must be a pydantic model, got {type(state).__name__}"
            )
        flat: list[Emit] = []
        cancels: list[str] = []
        for item in emits:
            if isinstance(item, Emit | Cancel):
                _add(item, flat, cancels)
                continue
            if isinstance(item, str | bytes | dict | BaseModel) or not isinstance(item, Iterable):
                raise InvalidHandlerResult(
                    f"a Decision takes Emit values (or iterables of them), got "
                    f"{type(item).__name__}; use docoutbox.emit()"
                )
            for sub in item:
                if not isinstance(sub, Emit | Cancel):
                    raise InvalidHandlerResult(
                        f"a Decision takes Emit values, got {type(sub).__name__} in "
                        f"{type(item).__name__}; use docoutbox.emit()"
                    )
                _add(sub, flat, cancels)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "emits", tuple(flat))
        object.__setattr__(self, "cancels", tuple(dict.fromkeys(cancels)))


def _add(item: Emit | Cancel, emits: list[Emit], cancels: list[str]) -> None:
    if isinstance(item, Cancel):
        cancels.append(item.key)
    else:
        emits.append(item)


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler may know besides its state and message.

    >>> @handlers.on("OpenAccount")
    ... def open_account(account: Account, message: Message, context: Context) -> Account:
    ...     return account.model_copy(update={"number": context.aggregate_id,
    ...                                       "opened_at": context.now.isoformat()})

    ``now`` is the store's clock (``StoreConfig.clock``) read once for this handling, so
    a handler that needs the time stays a pure function of its arguments.
    """

    aggregate_id: AggregateId
    aggregate_type: str
    message_id: str
    message_type: str
    headers: Mapping[str, str]
    correlation_id: str | None
    causation_id: str | None
    now: datetime
    #: The aggregate's scheduled entries that may still be cancelled: key -> due time.
    scheduled: Mapping[str, datetime] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        aggregate_id: AggregateId,
        aggregate_type: str,
        message: Message,
        now: datetime,
        scheduled: Mapping[str, datetime] | None = None,
    ) -> Context:
        """The context of handling ``message`` on the aggregate ``aggregate_id``."""
        return cls(
            aggregate_id,
            aggregate_type,
            message.id,
            message.type,
            message.headers,
            message.correlation_id,
            message.causation_id,
            now,
            scheduled if scheduled is not None else {},
        )


#: A handler: ``(state, message)`` or ``(state, message, context)`` to a state or Decision.
Handler = Callable[..., "S | Decision[S]"]

#: Handlers already inspected, so a function is inspected once, not per message.
_TAKES_CONTEXT: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _inspect(fn: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: two arguments
        return False
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 3


def takes_context(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` accepts a third positional argument (the :class:`Context`).

    ``*args`` alone does not count, so a generic two-argument wrapper keeps receiving two
    arguments; decorators that use ``functools.wraps`` are seen through. The answer is
    remembered per function object.
    """
    if isinstance(fn, Handlers):
        return True
    try:
        return _TAKES_CONTEXT[fn]
    except KeyError:
        pass
    except TypeError:  # not weakly referable (or unhashable): inspect every time
        return _inspect(fn)
    found = _TAKES_CONTEXT[fn] = _inspect(fn)
    return found


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
        decision.__dict__.update(state=result, emits=(), cancels=())
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

    A handler registered here takes ``(state, message)`` or ``(state, message,
    context)`` (a :class:`Context`): its signature is inspected once, by :meth:`on`.
    """

    def __init__(self) -> None:
        self._by_type: dict[str, tuple[Handler[S], bool]] = {}

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
            contextual = _inspect(fn)
            for name in types:
                self._by_type[name] = (fn, contextual)
            return fn

        return register

    def resolve(self, message_type: str) -> tuple[Handler[S], bool]:
        """The handler of ``message_type`` and whether it takes a :class:`Context`;
        UnknownMessageType if none is registered. The stores call it so as to build a
        context only for the handlers that take one."""
        try:
            return self._by_type[message_type]
        except KeyError:
            raise UnknownMessageType(f"no handler for message type {message_type!r}") from None

    def __call__(
        self, state: S, message: Message, context: Context | None = None
    ) -> S | Decision[S]:
        """Run the handler of ``message.type``; a handler that takes a context needs one
        (the stores always pass it)."""
        fn, contextual = self.resolve(message.type)
        if not contextual:
            return fn(state, message)
        if context is None:
            raise InvalidConfig(
                f"the handler of {message.type!r} takes a Context: call it with one "
                "(state, message, context), or through a store"
            )
        return fn(state, message, context)

    @property
    def types(self) -> frozenset[str]:
        """The message types with a handler."""
        return frozenset(self._by_type)


def check_handling(handler: object, create: object) -> None:
    """``handle``'s ``handler`` (a :class:`Handlers` or a function: callable) and
    ``create`` (a bool: "no" is truthy)."""
    if not callable(handler):
        raise InvalidConfig(
            f"handler must be callable (a Handlers or a function), got {type(handler).__name__}"
        )
    if type(create) is not bool:
        raise InvalidConfig(f"create must be a bool, got {create!r}")
