"""A quarantined claim-checked entry: dead-lettered by reference, its payload kept for the
dead letter (never deleted by the dispatcher, never swept while a dead letter refers to
it), and replayed whole."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest

from docoutbox.dispatch.engine.flow import DispatchPolicy, Publish, Quarantine, dispatch_document
from docoutbox.dispatch.tools.replay import GONE, DeadLetterAdmin
from docoutbox.errors import InvalidInput, PermanentPublishError, PublishError
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.stored.claim import DeletePayloads
from docoutbox.stored.sweep import sweep_orphans, sweep_orphans_async
from docoutbox.testing.memory import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.payloads import AsyncMemoryPayloads, MemoryPayloads
from docoutbox.testing.publisher import MemoryDeadLetters
from tests.support.dispatch_flow import accept, dispatch_run
from tests.support.loopless import run
from tests.unit.test_claim_check import BIG, SMALL, T0, emit, message, store

Publisher = Callable[[OutboxMessage], None]


def refuse(entry: OutboxMessage) -> None:
    raise PermanentPublishError("the broker refused it for good")


def nack(entry: OutboxMessage) -> None:
    raise PublishError("nacked")


def dispatch(
    backend: MemoryBackend,
    payloads: MemoryPayloads,
    dead: MemoryDeadLetters,
    publish: Publisher,
    policy: DispatchPolicy | None = None,
) -> tuple[list[Any], Any]:
    """One run of the dispatch flow over aggregate ``a``, every op performed."""
    return dispatch_run(backend, payloads, T0, publish=publish, dead=dead, policy=policy)


def quarantined(publish: Publisher, policy: DispatchPolicy | None = None) -> Any:
    """A large entry, then a small one, dispatched to a broker that refuses the first."""
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    s.handle("a", message(2), emit(SMALL))
    backend: MemoryBackend = s.backend  # type: ignore[assignment]
    big = backend.docs["a"]["outbox"][0]
    dead = MemoryDeadLetters()
    sent: list[OutboxMessage] = []

    def broker(entry: OutboxMessage) -> None:
        if entry.id == big["id"]:
            publish(entry)
        sent.append(entry)

    ops, result = dispatch(backend, payloads, dead, broker, policy)
    return backend, payloads, dead, big, ops, result, sent


def test_a_permanent_failure_dead_letters_the_reference_and_keeps_the_payload() -> None:
    backend, payloads, dead, big, ops, result, sent = quarantined(refuse)
    letter = dead.entries[big["id"]]["entry"]
    assert "payload" not in letter and letter["claim"] == big["claim"]
    assert result.quarantined == [big["id"]] and [e.payload for e in sent] == [SMALL]
    assert result.trimmed and backend.docs["a"]["outbox"] == []
    assert not any(isinstance(op, DeletePayloads) for op in ops)
    assert list(payloads.items) == [big["claim"]["id"]]  # kept for the dead letter


def test_max_attempts_dead_letter_the_reference_too() -> None:
    _, payloads, dead, big, _, result, _ = quarantined(nack, DispatchPolicy(max_attempts=2))
    letter = dead.entries[big["id"]]
    assert letter["attempts"] == 2 and "payload" not in letter["entry"]
    assert letter["entry"]["claim"] == big["claim"] and len(payloads.items) == 1
    assert result.quarantined == [big["id"]]


def test_a_malformed_resolved_entry_is_dead_lettered_by_reference() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    backend: MemoryBackend = s.backend  # type: ignore[assignment]
    backend.docs["a"]["outbox"][0]["due"] = "soon"  # not a time: malformed once read
    dead = MemoryDeadLetters()
    _, result = dispatch(backend, payloads, dead, accept)
    (letter,) = dead.entries.values()
    assert "payload" not in letter["entry"] and "claim" in letter["entry"]
    assert result.quarantined and len(payloads.items) == 1


# -- the orphan sweep ---------------------------------------------------------------------


def test_the_sweep_keeps_a_payload_a_dead_letter_refers_to() -> None:
    backend, payloads, dead, big, _, _, _ = quarantined(refuse)
    later = T0 + timedelta(hours=2)
    report = sweep_orphans(backend, payloads, 100.0, dead_letters=dead, now=later)
    assert report.referenced == [big["claim"]["id"]] and not report.deleted
    dead.entries.clear()  # purged: the payload is an orphan now
    report = sweep_orphans(backend, payloads, 100.0, dead_letters=dead, now=later)
    assert report.deleted == [big["claim"]["id"]] and payloads.items == {}


class ReplayedMeanwhile:
    """Dead letters replayed while the sweep reads them: the entry goes back on the
    outbox and the dead letter is deleted, between the sweep's first read of the outbox
    and its read of the dead letters."""

    def __init__(self, backend: MemoryBackend, dead: MemoryDeadLetters) -> None:
        self.backend, self.dead = backend, dead

    def refers_to(self, payload_id: str) -> bool:
        for name, letter in list(self.dead.entries.items()):
            self.backend.docs["a"]["outbox"].append(dict(letter["entry"], id=f"{name}~r1"))
            del self.dead.entries[name]
        return self.dead.refers_to(payload_id)


def test_the_sweep_keeps_a_payload_whose_dead_letter_is_replayed_while_it_reads() -> None:
    backend, payloads, dead, big, _, _, _ = quarantined(refuse)
    racing = ReplayedMeanwhile(backend, dead)
    later = T0 + timedelta(hours=2)
    report = sweep_orphans(backend, payloads, 100.0, dead_letters=racing, now=later)
    assert report.referenced == [big["claim"]["id"]] and len(payloads.items) == 1


# -- replay -------------------------------------------------------------------------------


class Letters:
    """The dead-letter store of ``docoutbox dead-letters`` over memory ports."""

    aggregates: str | None = "boxes"

    def __init__(self, backend: MemoryBackend, dead: MemoryDeadLetters) -> None:
        self.backend, self.dead = backend, dead

    def listing(self, limit: int) -> list[dict[str, Any]]:
        return [{"_id": k, **v} for k, v in self.dead.entries.items()][: limit or None]

    def count(self) -> int:
        return len(self.dead.entries)

    def find(self, dead_letter_id: str) -> dict[str, Any] | None:
        found = self.dead.entries.get(dead_letter_id)
        return None if found is None else {"_id": dead_letter_id, **found}

    def delete(self, ids: Sequence[str] | None) -> int:
        names = list(self.dead.entries) if ids is None else ids
        return sum(self.dead.entries.pop(n, None) is not None for n in names)

    def aggregate_type(self, aggregate_id: AggregateId) -> object:
        doc = self.backend.docs.get(aggregate_id)
        return GONE if doc is None else doc.get("type")

    def append(self, aggregate_id: AggregateId, entry: dict[str, Any]) -> bool:
        self.backend.docs[aggregate_id]["outbox"].append(entry)
        return True


def test_a_replay_puts_the_reference_back_and_the_dispatcher_publishes_it_whole() -> None:
    backend, payloads, dead, big, _, _, _ = quarantined(refuse)
    [done] = DeadLetterAdmin(Letters(backend, dead)).replay([big["id"]])
    [again] = backend.docs["a"]["outbox"]
    assert done.action == "re-appended" and "payload" not in again
    assert again["claim"] == big["claim"] and again["seq"] == big["seq"]
    sent: list[OutboxMessage] = []
    _, result = dispatch(backend, payloads, dead, sent.append)
    assert [e.payload for e in sent] == [BIG] and sent[0].id == again["id"]
    assert result.trimmed and payloads.items == {}  # published: deleted after the trim


def test_an_encoded_claim_checked_dead_letter_is_refused_by_name() -> None:
    backend, _, dead, big, _, _, _ = quarantined(refuse)
    dead.entries[big["id"]]["entry"]["claim"]["encoded"] = True
    admin = DeadLetterAdmin(Letters(backend, dead))
    with pytest.raises(InvalidInput, match="claim-checked entry encoded"):
        admin.replay([big["id"]])
    assert big["id"] in dead.entries


class AsyncLetters:
    """An async dead-letter store, as the async sweep asks it."""

    def __init__(self, dead: MemoryDeadLetters) -> None:
        self.dead = dead

    async def refers_to(self, payload_id: str) -> bool:
        return self.dead.refers_to(payload_id)


def test_the_async_sweep_keeps_a_payload_a_dead_letter_refers_to() -> None:
    backend, payloads, dead, big, _, _, _ = quarantined(refuse)
    shared = AsyncMemoryBackend(backend)
    later = T0 + timedelta(hours=2)
    letters = AsyncLetters(dead)
    pid = big["claim"]["id"]
    report = run(
        sweep_orphans_async(
            shared, AsyncMemoryPayloads(payloads), 100.0, dead_letters=letters, now=later
        )
    )
    assert report.referenced == [pid] and pid in payloads.items
    dead.entries.clear()
    report = run(
        sweep_orphans_async(
            shared, AsyncMemoryPayloads(payloads), 100.0, dead_letters=letters, now=later
        )
    )
    assert report.deleted == [pid] and payloads.items == {}


def test_publishing_references_dead_letters_the_reference_too() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    backend: MemoryBackend = s.backend  # type: ignore[assignment]
    (big,) = backend.docs["a"]["outbox"]
    dead = MemoryDeadLetters()
    doc = backend.load("a")
    flow = dispatch_document(doc, DispatchPolicy(), random.Random(1), None, T0, references=True)
    op = next(flow)
    assert isinstance(op, Publish)
    op = flow.throw(PermanentPublishError("refused"))
    assert isinstance(op, Quarantine)
    dead.put(op.aggregate_id, op.entry, op.error, op.attempts)
    letter = dead.entries[big["id"]]["entry"]
    assert "payload" not in letter and letter["claim"] == big["claim"]
    assert dead.refers_to(big["claim"]["id"])  # the sweep keeps its payload
