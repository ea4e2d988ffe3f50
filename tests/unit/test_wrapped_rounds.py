"""Publish rounds through the guarded and settled publishers: each has ``publish_many``
exactly when the publisher it wraps has one, so a dispatcher keeps its rounds through
them and never takes a wrapper of a plain publisher for one that pipelines; each entry
keeps its wrapper's rule (guard, settle) and its own outcome."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from docoutbox.dispatch.drivers.aio import in_thread
from docoutbox.dispatch.drivers.operations import AsyncPorts, Ports
from docoutbox.dispatch.engine.flow import Publish
from docoutbox.dispatch.engine.loop import PublishRound
from docoutbox.dispatch.extras.claims import (
    AsyncGuardedPublisher,
    AsyncPipelinedGuardedPublisher,
    Claims,
    GuardedPublisher,
    PipelinedGuardedPublisher,
    WaitClaim,
    claimed_round,
)
from docoutbox.dispatch.extras.settled import (
    AsyncPipelinedSettledPublisher,
    AsyncSettledPublisher,
    PipelinedSettledPublisher,
    SettledPublisher,
)
from docoutbox.errors import BrokerUnavailable, PublishError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import AsyncPipelinedPublisher, PipelinedPublisher
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend, MemoryPublisher
from docoutbox.testing.publisher import AsyncMemoryPublisher, FailureRule, MemoryDeadLetters
from tests.support.loopless import run
from tests.unit.test_immediate import one_trimmed_one_pending
from tests.unit.test_publish_rounds import Plain, message

NACKED = PublishError("nacked")


def nack_b(entry: OutboxMessage) -> Exception | None:
    return NACKED if entry.aggregate_id == "b" else None


class Broken:
    """A pipelining publisher whose rounds fail as a whole."""

    def publish(self, entry: OutboxMessage) -> None:
        raise AssertionError("a round goes to publish_many")

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        raise BrokerUnavailable("down")


class Rounds(MemoryPublisher):
    """A memory publisher noting the entry IDs of each round it gets."""

    def __init__(self, fail: FailureRule | None = None) -> None:
        super().__init__(fail)
        self.rounds: list[list[str]] = []

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        self.rounds.append([e.id for e in entries])
        return super().publish_many(entries)


def guarded(inner: Any) -> GuardedPublisher:
    return GuardedPublisher(inner, Claims())


def settled(inner: Any) -> SettledPublisher:
    return SettledPublisher(inner, MemoryBackend())


def pipelined_guard(inner: Any) -> PipelinedGuardedPublisher:
    publisher = guarded(inner)
    assert isinstance(publisher, PipelinedGuardedPublisher)
    return publisher


def test_the_memory_publisher_pipelines_with_one_outcome_per_entry() -> None:
    publisher = MemoryPublisher(fail=nack_b)
    assert isinstance(publisher, PipelinedPublisher)
    assert publisher.publish_many([message(a) for a in "abc"]) == [None, NACKED, None]
    assert publisher.ids() == ["a-1", "c-1"]
    async_publisher = AsyncMemoryPublisher(publisher)
    assert isinstance(async_publisher, AsyncPipelinedPublisher)
    assert run(async_publisher.publish_many([message("d"), message("b")])) == [None, NACKED]
    assert publisher.ids() == ["a-1", "c-1", "d-1"]


@pytest.mark.parametrize("wrap", [guarded, settled], ids=["guarded", "settled"])
def test_a_sync_wrapper_pipelines_exactly_when_its_publisher_does(wrap: Any) -> None:
    dead = MemoryDeadLetters()
    assert Ports(MemoryBackend(), wrap(MemoryPublisher()), dead).pipelined
    plain = wrap(Plain())
    assert not hasattr(plain, "publish_many")
    assert not Ports(MemoryBackend(), plain, dead).pipelined


@pytest.mark.parametrize(
    "wrap",
    [
        lambda inner: AsyncGuardedPublisher(inner, Claims()),
        lambda inner: AsyncSettledPublisher(inner, AsyncMemoryBackend()),
    ],
    ids=["guarded", "settled"],
)
def test_an_async_wrapper_pipelines_exactly_when_its_publisher_does(wrap: Any) -> None:
    dead = in_thread(MemoryDeadLetters())
    assert AsyncPorts(AsyncMemoryBackend(), wrap(AsyncMemoryPublisher()), dead).pipelined
    plain = wrap(in_thread(Plain()))
    assert not hasattr(plain, "publish_many")
    assert not AsyncPorts(AsyncMemoryBackend(), plain, dead).pipelined


def test_a_guarded_round_skips_what_was_published_and_keeps_each_outcome() -> None:
    inner = Rounds(fail=nack_b)
    publisher = pipelined_guard(inner)
    publisher.claims.claim("c-1")
    publisher.claims.finish("c-1", True)  # the other path published it
    entries = [message(a) for a in "abcd"]
    assert publisher.publish_many(entries) == [None, NACKED, None, None]
    assert inner.ids() == ["a-1", "d-1"] and publisher.skipped == 1
    assert inner.rounds == [["a-1", "b-1", "d-1"]]
    claims = publisher.claims
    assert [claims.claim(e.id) for e in entries] == ["done", "mine", "done", "done"]


def test_an_async_guarded_round_skips_what_was_published_and_keeps_each_outcome() -> None:
    inner = MemoryPublisher(fail=nack_b)
    publisher = AsyncGuardedPublisher(AsyncMemoryPublisher(inner), Claims())
    assert isinstance(publisher, AsyncPipelinedGuardedPublisher)
    publisher.claims.claim("c-1")
    publisher.claims.finish("c-1", True)
    entries = [message(a) for a in "abcd"]
    assert run(publisher.publish_many(entries)) == [None, NACKED, None, None]
    assert inner.ids() == ["a-1", "d-1"] and publisher.skipped == 1
    assert publisher.claims.claim("b-1") == "mine"


def test_a_failed_round_ends_its_claims_and_raises() -> None:
    publisher = pipelined_guard(Broken())
    with pytest.raises(BrokerUnavailable):
        publisher.publish_many([message("a"), message("b")])
    assert [publisher.claims.claim(i) for i in ("a-1", "b-1")] == ["mine", "mine"]


def test_an_entry_another_path_holds_waits_after_the_round() -> None:
    claims = Claims()
    held = claims.claim("b-1")
    assert held == "mine"  # the other path is publishing b-1
    entries = [message(a) for a in "abc"]
    flow = claimed_round(claims, entries, wait=5.0)
    first = next(flow)
    assert isinstance(first, PublishRound) and [e.id for e in first.entries] == ["a-1", "c-1"]
    wait = flow.send([None, NACKED])
    assert isinstance(wait, WaitClaim) and wait.timeout == 5.0
    assert claims.claim("a-1") == "done" and claims.claim("c-1") == "mine"
    claims.finish("b-1", True)  # the other path published it meanwhile
    with pytest.raises(StopIteration) as stop:
        flow.send(True)
    assert stop.value.value.outcomes == [None, None, NACKED]
    assert stop.value.value.skipped == 1


def test_a_held_entry_that_fails_has_its_error_as_its_outcome() -> None:
    claims = Claims()
    claims.claim("a-1")
    flow = claimed_round(claims, [message("a")], wait=5.0)
    assert isinstance(next(flow), WaitClaim)
    publish = flow.send(False)  # the other path took too long: publish anyway
    assert isinstance(publish, Publish)
    with pytest.raises(StopIteration) as stop:
        flow.throw(NACKED)
    assert stop.value.value.outcomes == [NACKED]


def young_and_old(backend: MemoryBackend) -> tuple[list[OutboxMessage], datetime]:
    """A young entry trimmed, a young one pending and an old one; the time now."""
    first, second = one_trimmed_one_pending(backend)
    now = max(first.created_at, second.created_at) + timedelta(seconds=0.1)
    old = message("z").model_copy(update={"created_at": now - timedelta(seconds=5)})
    return [first, old, second], now


def test_a_settled_round_waits_once_and_sends_what_is_still_pending() -> None:
    backend = MemoryBackend()
    entries, now = young_and_old(backend)
    inner = MemoryPublisher()
    slept: list[float] = []
    publisher = SettledPublisher(inner, backend, 0.5, clock=lambda: now, sleep=slept.append)
    assert isinstance(publisher, PipelinedSettledPublisher)
    assert publisher.publish_many(entries) == [None, None, None]
    assert inner.ids() == [entries[1].id, entries[2].id] and publisher.skipped == 1
    youngest = min((now - e.created_at).total_seconds() for e in entries)
    assert slept == [pytest.approx(0.5 - youngest)]


def test_a_settled_round_keeps_each_outcome_and_sends_no_round_when_all_are_gone() -> None:
    backend = MemoryBackend()
    entries, now = young_and_old(backend)
    inner = Rounds(fail=lambda e: NACKED if e.aggregate_id == "z" else None)
    publisher = SettledPublisher(inner, backend, 0.5, clock=lambda: now, sleep=lambda s: None)
    assert isinstance(publisher, PipelinedSettledPublisher)
    assert publisher.publish_many(entries) == [None, NACKED, None]
    assert inner.ids() == [entries[2].id]
    assert inner.rounds == [[entries[1].id, entries[2].id]]
    assert publisher.publish_many([entries[0]]) == [None]
    assert inner.rounds == [[entries[1].id, entries[2].id]] and publisher.skipped == 2


def test_an_async_settled_round_waits_once_and_sends_what_is_still_pending() -> None:
    backend = MemoryBackend()
    entries, now = young_and_old(backend)
    inner = MemoryPublisher()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    publisher = AsyncSettledPublisher(
        AsyncMemoryPublisher(inner),
        AsyncMemoryBackend(backend),
        0.5,
        clock=lambda: now,
        sleep=sleep,
    )
    assert isinstance(publisher, AsyncPipelinedSettledPublisher)
    outcomes = run(publisher.publish_many(entries))
    assert outcomes == [None, None, None] and publisher.skipped == 1
    assert inner.ids() == [entries[1].id, entries[2].id] and len(slept) == 1
