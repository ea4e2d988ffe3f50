"""A partition acquired with a position stored in its lease (Cosmos DB feed ranges) needs
no sweep: the new owner's stream resumes where the previous holders' work ended. Without
a stored position (MongoDB, or a lease's first use) every acquisition is swept. A holder
may store a partition's position only while it has been usable without a break."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig
from docoutbox.store.core import FindPending
from docoutbox.testing.dispatch import MemoryLeaseTable

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class StoredPositions(MemoryLeaseTable):
    """Leases of which ``stored`` carry a stream position (as Cosmos feed-range leases
    carry their continuation once first used)."""

    def __init__(self, stored: set[int]) -> None:
        super().__init__()
        self.stored = stored
        self.guard: Any = None

    def resumes(self, partition: int) -> bool:
        return partition in self.stored

    def guard_checkpoints(self, check: Any, usable: Any) -> None:
        self.guard = check


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    def mono(self) -> float:
        return self.t


def keeper(table: MemoryLeaseTable, clock: Clock, owner: str = "a") -> LeaseKeeper:
    return LeaseKeeper(
        table,
        partitions=4,
        owner=owner,
        timing=LeaseTiming(ttl=4, interval=1, margin=1),
        clock=clock.wall,
        monotonic=clock.mono,
        rng=random.Random(0),
    )


def sweeps_on_acquisition(ownership: LeaseKeeper) -> list[list[int] | None]:
    """The partitions of every sweep query (without grace) the engine's next turns make."""
    engine = DispatchEngine(
        DispatcherConfig(name="q", partitions=4, sweep_interval=3600),
        ownership,
        stream=False,
        checkpoints=False,
        monotonic=lambda: 0.0,
        clock=lambda: NOW,
        rng=random.Random(0),
    )
    engine.sweeps.clear()  # begin() is not called: only the acquisitions' sweeps
    queries: list[list[int] | None] = []
    for _ in range(3):
        flow, answer = engine.turn(), None
        try:
            while True:
                op = flow.send(answer)
                assert isinstance(op, FindPending)
                if op.older_than is None:  # not the periodic sweep (with a grace)
                    queries.append(op.partitions)
                answer = []
        except StopIteration:
            pass
    return queries


def test_partitions_with_a_stored_position_are_not_swept_on_acquisition() -> None:
    clock = Clock()
    a = keeper(StoredPositions({0, 1, 2, 3}), clock)
    a.tick()
    assert a.owned() == frozenset(range(4))
    assert sweeps_on_acquisition(a) == []


def test_partitions_without_one_are_swept_and_only_they() -> None:
    clock = Clock()
    a = keeper(StoredPositions({1, 3}), clock)
    a.tick()
    assert a.owned() == frozenset(range(4))
    assert sweeps_on_acquisition(a) == [[0, 2]]


def test_a_table_that_cannot_tell_has_every_acquisition_swept() -> None:
    clock = Clock()
    a = keeper(MemoryLeaseTable(), clock)
    a.tick()
    assert sweeps_on_acquisition(a) == [[0, 1, 2, 3]]


def test_a_partition_usable_again_after_a_lapse_is_swept_and_not_checkpointed() -> None:
    table, clock = StoredPositions({0, 1, 2, 3}), Clock()
    a = keeper(table, clock)
    a.tick()
    assert table.guard is not None and all(table.guard(p) for p in range(4))
    assert sweeps_on_acquisition(a) == []
    clock.t = 3.5  # no renewal since t=0: unusable after ttl - margin = 3 s
    assert not any(table.guard(p) for p in range(4))
    a.tick()  # renewed: usable again, but events may have been passed over meanwhile
    assert a.owned() == frozenset(range(4))
    assert sweeps_on_acquisition(a) == [[0, 1, 2, 3]]
    assert not any(table.guard(p) for p in range(4))  # its position stays as stored


def test_a_partition_being_handed_over_is_not_checkpointed() -> None:
    table, clock = StoredPositions({0, 1, 2, 3}), Clock()
    a = keeper(table, clock)
    a.tick()
    assert a.enter(3)  # busy: the hand-over waits for the worker
    b = keeper(table, clock, owner="b")
    b.tick()
    clock.t += 1
    a.tick()  # a hands 2 partitions over; the busy one stays held
    assert table.leases[3][0] == "a"
    assert not a.checkpointable(3) and a.checkpointable(0)
    a.leave(3)
    clock.t += 1
    a.tick()
    b.tick()
    assert table.leases[3][0] == "b"
    assert not a.checkpointable(3) and b.checkpointable(3)
    assert sweeps_on_acquisition(b) == []  # b resumes from the stored positions
