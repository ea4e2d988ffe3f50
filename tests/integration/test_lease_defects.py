"""Lease defects found in acceptance testing, each pinned by a test that fails without its fix:
mismatched partition counts, heartbeats stuck behind hand-overs, dead members kept forever.

Here: dispatchers and heartbeats on threads; the pure parts are in
``tests/unit/test_lease_defects.py``.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.engine.loop import partition_mismatch
from docoutbox.errors import PartitionMismatch
from docoutbox.store.core import StoreConfig
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryLeaseTable
from tests.unit.test_lease_defects import Clock, keeper


def stored(partitions: int, aggregates: int = 12) -> MemoryBackend:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter, StoreConfig(partitions=partitions))
    for i in range(aggregates):
        store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
    return backend


def leased(backend: MemoryBackend, partitions: int) -> Dispatcher:
    keeper = LeaseKeeper(MemoryLeaseTable(), partitions=partitions, owner="me")
    return Dispatcher(
        backend,
        MemoryPublisher(),
        MemoryDeadLetters(),
        ownership=keeper,
        config=DispatcherConfig(partitions=partitions, poll_interval=0.005),
    )


@pytest.mark.parametrize(("stores", "dispatcher"), [(16, 4), (4, 16)])
def test_a_dispatcher_partitioned_unlike_its_stores_refuses_to_start(
    stores: int, dispatcher: int
) -> None:
    backend = stored(stores)
    instance = leased(backend, dispatcher)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            instance.run()
        except PartitionMismatch as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():
        instance.stop()
        thread.join(5)
        pytest.fail("started, stranding the aggregates of partitions no instance owns")
    assert len(errors) == 1 and "StoreConfig.partitions" in str(errors[0])
    assert not instance.started.is_set()
    assert partition_mismatch(list(backend.docs.values()), stores) is None


def test_a_dispatcher_partitioned_like_its_stores_drains_them() -> None:
    backend = stored(4)
    dispatcher = leased(backend, 4)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    assert dispatcher.started.wait(5)
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while any(doc.get("outbox") for doc in backend.docs.values()):
        assert datetime.now(UTC) < deadline
        threading.Event().wait(0.01)
    dispatcher.stop()
    thread.join(10)


def test_a_heartbeat_never_waits_for_busy_partitions_it_hands_over() -> None:
    """Each busy partition handed over used to hold the tick for heartbeat/2 (here 30 s),
    one after another, while the leases it kept went unrenewed."""
    table, clock = MemoryLeaseTable(), Clock()
    timing = LeaseTiming(ttl=240, interval=60, margin=60)
    a = keeper(table, "a", clock, timing)
    a.tick()
    for p in range(4):
        assert a.enter(p)  # a worker inside every partition
    keeper(table, "b", clock, timing).tick()  # b joins: a must hand two over
    done = threading.Event()
    thread = threading.Thread(target=lambda: (a.tick(), done.set()), daemon=True)
    thread.start()
    assert done.wait(10), "the heartbeat waited behind the hand-over"
    assert {owner for owner, _ in table.leases.values()} == {"a"}  # busy: still held
    for p in range(4):
        a.leave(p)
    a.tick()  # idle now: the surplus goes
    assert sorted(owner for owner, _ in table.leases.values()) == ["a", "a"]
