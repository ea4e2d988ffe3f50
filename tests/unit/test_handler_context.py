"""Handler context: a handler taking a third argument gets the aggregate ID, the message's
metadata and the store's clock; two-argument handlers are called as before; the signature is
inspected once, not per message; the same through handle, handle_batch (sync and async) and
the receive flow's batches."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import Field

from docoutbox import (
    Aggregate,
    AggregateStore,
    AsyncAggregateStore,
    Context,
    Decision,
    Handlers,
    Message,
    StoreConfig,
    emit,
)
from docoutbox.errors import InvalidConfig, UnknownMessageType
from docoutbox.handlers import takes_context
from docoutbox.receive import Delivery, Options, Receiver
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from tests.support import loopless

NOON = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


class Note(Aggregate):
    aggregate_type = "Note"
    seen: list[str] = Field(default_factory=list)
    two_args: int = 0


def contextual() -> Handlers[Note]:
    handlers: Handlers[Note] = Handlers()

    @handlers.on("Write")
    def write(note: Note, message: Message, context: Context) -> Decision[Note]:
        line = (
            f"{context.aggregate_type}/{context.aggregate_id} {context.message_type} "
            f"{context.message_id} {context.correlation_id} {context.causation_id} "
            f"{dict(context.headers)} {context.now.isoformat()}"
        )
        seen = [*note.seen, line]
        return Decision(note.model_copy(update={"seen": seen}), emit("Written", {"n": len(seen)}))

    @handlers.on("Count")
    def count(note: Note, message: Message) -> Note:
        return note.model_copy(update={"two_args": note.two_args + 1})

    return handlers


def message(mid: str, kind: str = "Write") -> Message:
    return Message(
        id=mid,
        type=kind,
        headers={"tenant": "t1"},
        correlation_id="corr",
        causation_id="cause",
    )


def store() -> AggregateStore[Note]:
    return AggregateStore(MemoryBackend(), Note, StoreConfig(clock=lambda: NOON))


def loaded(notes: AggregateStore[Note], aggregate_id: str) -> Note:
    snapshot = notes.load(aggregate_id)
    assert snapshot is not None
    return snapshot.state


def expected(mid: str, aggregate_id: str = "n-1") -> str:
    return f"Note/{aggregate_id} Write {mid} corr cause {{'tenant': 't1'}} {NOON.isoformat()}"


def test_a_three_argument_handler_gets_the_context_from_the_store() -> None:
    notes = store()
    outcome = notes.handle("n-1", message("m-1"), contextual(), create=True)
    assert outcome.applied
    assert outcome.state is not None and outcome.state.seen == [expected("m-1")]
    assert [e.type for e in outcome.emitted] == ["Written"]


def test_two_argument_handlers_keep_working_beside_them() -> None:
    notes = store()
    handlers = contextual()
    notes.handle("n-1", message("m-1", "Count"), handlers, create=True)
    # Called directly, as before: no context needed for a two-argument handler.
    direct = handlers(Note(), message("m-2", "Count"))
    assert isinstance(direct, Note) and direct.two_args == 1
    assert loaded(notes, "n-1").two_args == 1


def test_a_context_is_made_only_for_the_handlers_that_take_one() -> None:
    """The store reads its clock once for the commit, and once more only for a handler
    of the registry that takes a context (the registry hands over the type's handler)."""
    reads: list[int] = []

    def clock() -> datetime:
        reads.append(1)
        return NOON

    notes = AggregateStore(MemoryBackend(), Note, StoreConfig(clock=clock))
    handlers = contextual()
    notes.handle("n-1", message("m-0", "Count"), handlers, create=True)  # creates, then warm
    reads.clear()
    assert notes.handle("n-1", message("m-1", "Count"), handlers).applied
    assert len(reads) == 1
    reads.clear()
    outcome = notes.handle("n-1", message("m-2"), handlers)
    assert outcome.state is not None and outcome.state.seen == [expected("m-2")]
    assert len(reads) == 2


def test_the_registry_resolves_a_type_or_refuses_it() -> None:
    handlers = contextual()
    assert handlers.resolve("Count")[1] is False
    assert handlers.resolve("Write")[1] is True
    with pytest.raises(UnknownMessageType, match="Nope"):
        handlers.resolve("Nope")
    with pytest.raises(UnknownMessageType, match="Nope"):
        store().handle("n-1", message("m-1", "Nope"), handlers, create=True)


def test_a_contextual_handler_called_without_a_context_is_a_clear_error() -> None:
    with pytest.raises(InvalidConfig, match="takes a Context"):
        contextual()(Note(), message("m-1"))


def test_plain_functions_are_inspected_too() -> None:
    def plain(note: Note, message: Message, context: Context) -> Note:
        return note.model_copy(update={"seen": [str(context.aggregate_id)]})

    def two(note: Note, message: Message) -> Note:
        return note

    outcome = store().handle(7, message("m-1"), plain, create=True)
    assert outcome.state is not None and outcome.state.seen == ["7"]
    assert takes_context(plain) and not takes_context(two)


def test_star_args_and_wrapped_functions() -> None:
    def generic(*args: Any) -> Any:
        return args[0]

    def two(note: Note, message: Message) -> Note:
        return note

    @functools.wraps(two)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return two(*args, **kwargs)

    assert not takes_context(generic)  # *args alone: called with two arguments
    assert not takes_context(wrapper)  # seen through functools.wraps
    assert not takes_context(len)  # no signature: two arguments
    assert takes_context(Handlers())


def test_the_signature_is_inspected_once_at_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handlers = contextual()
    calls: list[object] = []
    real = __import__("inspect").signature

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr("docoutbox.handlers.inspect.signature", counting)
    notes = store()
    for n in range(5):
        notes.handle("n-1", message(f"m-{n}"), handlers, create=True)
    notes.handle_batch("n-1", [message(f"b-{n}") for n in range(3)], handlers)
    assert calls == []


def test_handle_batch_passes_each_message_its_context() -> None:
    notes = store()
    results = notes.handle_batch("n-2", [message("a"), message("b")], contextual(), create=True)
    assert all(r.status == "applied" for r in results.results)
    assert loaded(notes, "n-2").seen == [expected("a", "n-2"), expected("b", "n-2")]


def test_the_async_store_passes_the_context() -> None:
    async def run() -> Note:
        notes = AsyncAggregateStore(AsyncMemoryBackend(), Note, StoreConfig(clock=lambda: NOON))
        await notes.handle("n-1", message("m-1"), contextual(), create=True)
        await notes.handle_batch("n-1", [message("m-2")], contextual())
        snapshot = await notes.load("n-1")
        assert snapshot is not None
        return snapshot.state

    assert loopless.run(run()).seen == [expected("m-1"), expected("m-2")]


def test_the_receive_flow_batches_keep_the_context() -> None:
    notes = store()
    receiver = Receiver(notes, contextual(), lambda m: "n-3", Options(create=True))
    bodies = [Delivery(message(mid).model_dump_json().encode()) for mid in ("x", "y", "z")]
    verdicts = receiver.receive(bodies)
    assert [v.action for v in verdicts] == ["ack"] * 3
    assert loaded(notes, "n-3").seen == [expected(mid, "n-3") for mid in ("x", "y", "z")]
