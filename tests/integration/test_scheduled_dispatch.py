"""Scheduled and cancelled entries through real dispatchers on the test servers.

Every driver of each backend: a scheduled entry is published once, never before it is
due, and within a wall-clock bound (generous for a loaded machine; the documented bound
is in docs/how-to/schedule.md); a cancelled one is never published. The store-level
rules (release against cancel, the hint, the due query) are checked on the wire server
without a dispatcher.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, OutboxMessage
from docoutbox.dispatch.extras.immediate import ImmediateDispatcher
from docoutbox.store.document import utcnow
from docoutbox.store.plans import ReleasePlan, SettlePlan
from docoutbox.testing import MemoryBackend, MemoryPublisher
from tests.support.backends import (
    BACKENDS,
    DISPATCH_DRIVERS,
    DispatchEnv,
    bundle_of,
    dispatch_env_of,
    wait_until,
)
from tests.unit.test_scheduled import Timer, handlers, msg
from tests.unit.test_scheduled_seq import check_release_and_commit_never_share_a_seq

#: How late a due entry may be published here: the documented bound (about 2 s with the
#: default ``due_interval``) with room for a loaded 2-core machine.
LATE = timedelta(seconds=10)


class Clocked(MemoryPublisher):
    """Records when each entry was published."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, list[datetime]] = {}
        self._times = threading.Lock()

    def publish(self, entry: OutboxMessage) -> None:
        super().publish(entry)
        with self._times:
            self.at.setdefault(entry.id, []).append(utcnow())


#: The backends whose stores answer the due query.
SCHEDULING = ("mongo", "cosmos")


@pytest.fixture(params=[p for p in DISPATCH_DRIVERS if p.values[0][0] in SCHEDULING])
def env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    kind, driver = request.param
    with dispatch_env_of(kind, request, driver) as made:
        yield made


def timers(env: DispatchEnv) -> AggregateStore[Timer]:
    return AggregateStore(env.bundle.store_backend(), Timer)


def test_scheduled_entries_are_published_once_when_due_and_cancelled_ones_never(
    env: DispatchEnv,
) -> None:
    publisher = Clocked()
    env.start(publisher)
    store = timers(env)
    due: dict[str, datetime] = {}
    for i in range(4):
        outcome = store.handle(
            f"t{i}", msg(f"s{i}", "Start", after=3 - i / 2), handlers, create=True
        )
        [entry] = outcome.entries
        due[entry["id"]] = entry["due"]
    doomed = store.handle("x", msg("s", "Start", after=1.5, key="k"), handlers, create=True)
    ping = store.handle("t0", msg("p", "Ping"), handlers)
    assert store.handle("x", msg("c", "Stop", key="k"), handlers).cancelled == ("k",)
    [pong] = ping.emitted
    wait_until(lambda: set(due) | {pong.id} <= set(publisher.at), timeout=30)
    for entry_id, when in due.items():
        [published] = publisher.at[entry_id]  # once
        assert when <= published <= when + LATE
    # The immediate entry t0 emitted after its scheduled one (due 3 s later) was not
    # held back by it: it went first.
    [timeout] = [entry.id for entry in publisher.published if entry.aggregate_id == "t0"][1:]
    assert publisher.ids().index(pong.id) < publisher.ids().index(timeout)
    wait_until(lambda: env.bundle.pending() == 0, timeout=30)
    [cancelled] = doomed.entries
    assert cancelled["id"] not in publisher.at
    for aggregate in ("t0", "t1", "t2", "t3", "x"):
        raw = store.load(aggregate)
        assert raw is not None and raw.raw_outbox == ()


@pytest.fixture(params=[p for p in BACKENDS if p.values[0] in SCHEDULING])
def bundle(request: pytest.FixtureRequest) -> Iterator[Any]:
    with bundle_of(request.param, request) as made:
        yield made


def test_release_cancel_settle_and_the_due_query_on_the_server(bundle: Any) -> None:
    backend = bundle.store_backend()
    backend.ensure_indexes()
    store = AggregateStore(backend, Timer)
    first = store.handle("a", msg("s1", "Start", after=60, key="k"), handlers, create=True)
    store.handle("b", msg("s2", "Start", after=3600, key="k"), handlers, create=True)
    store.handle("c", msg("p", "Ping"), handlers, create=True)
    [entry] = first.entries
    soon = entry["due"] + timedelta(seconds=1)
    found = backend.find_due(due_before=soon, after=None, limit=10)
    assert [doc["_id"] for doc in found] == ["a"]
    assert backend.find_due(due_before=soon, after="a", limit=10) == []
    partition = store.get("a").partition
    assert [
        d["_id"]
        for d in backend.find_due(due_before=soon, after=None, limit=10, partitions=[partition])
    ] == ["a"]
    # A release wins against a later cancel: the cancel then cancels nothing.
    assert backend.write(ReleasePlan("a", entry["id"], 0))
    released = store.get("a")
    assert [e["seq"] for e in released.raw_outbox] == [1] and released.outbox_seq == 1
    late = store.handle("a", msg("c1", "Stop", key="k"), handlers)
    assert late.cancelled == () and late.state.n == 0
    # A cancel wins against a later release.
    other = store.handle("b", msg("c2", "Stop", key="k"), handlers)
    assert other.cancelled == ("k",)
    cancelled_id = store.get("b").cancelled[0]
    assert not backend.write(ReleasePlan("b", cancelled_id, 0))
    assert store.trim("b", [cancelled_id])
    snap = store.get("b")
    # Cosmos DB trims leave the ID in ``cancelled`` (the next commit drops it).
    assert snap.raw_outbox == () and snap.cancelled in ((), (cancelled_id,))
    # A settle is guarded by version.
    version = store.get("a").version
    assert not backend.write(SettlePlan("a", version + 1, None))
    assert backend.write(SettlePlan("a", version, None))
    assert backend.find_due(due_before=soon, after=None, limit=10) == []


def test_a_release_and_a_commit_from_one_outbox_seq_never_share_a_seq_on_the_server(
    bundle: Any,
) -> None:
    check_release_and_commit_never_share_a_seq(bundle.store_backend())


def test_the_immediate_path_leaves_scheduled_entries_to_the_dispatcher() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Timer)
    publisher = MemoryPublisher()
    immediate = ImmediateDispatcher(store, publisher).start()
    try:
        store.handle("t", msg("s1", "Start", after=3600, key="a"), handlers, create=True)
        [pong] = store.handle("t", msg("p1", "Ping"), handlers).emitted  # reloads: a gap
        wait_until(lambda: publisher.ids() == [pong.id])
        immediate.drain()
    finally:
        immediate.stop()
    assert publisher.ids() == [pong.id]
    [left] = backend.docs["t"]["outbox"]
    assert left["key"] == "a"  # still pending, for the dispatcher once due
