"""Partition leases on the wire server: two dispatchers sharing one collection (no aggregate
dispatched by both at once, failover within a TTL). The lease table's conditional writes
are tested on every backend in ``test_dispatch_backends.py``."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.errors import TransientStoreError
from docoutbox_mongo.coordination import MongoLeaseTable
from tests.support.backends import DispatchEnv, OverlapDetector, dispatch_env_of, owned, wait_until

pytestmark = pytest.mark.wire

TTL = 2.0
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    with dispatch_env_of("mongo", request) as made:
        yield made


def keeper(env: DispatchEnv, owner: str) -> LeaseKeeper:
    return LeaseKeeper(
        MongoLeaseTable(env.db["leases"], "aggs"),
        partitions=16,
        owner=owner,
        timing=LeaseTiming(ttl=TTL),
    )


class Writer(threading.Thread):
    def __init__(self, env: DispatchEnv, aggregates: int) -> None:
        super().__init__(daemon=True)
        self.env, self.aggregates = env, aggregates
        self.halt = threading.Event()
        self.count = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.env.write(f"agg{self.count % self.aggregates}", f"w{self.count}")
                self.count += 1
                time.sleep(0.002)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_two_instances_share_partitions_and_fail_over_after_a_crash(env: DispatchEnv) -> None:
    detector = OverlapDetector()
    writer = Writer(env, aggregates=30)
    writer.start()
    a = env.start(detector.publisher("a"), ownership=keeper(env, "a"))
    wait_until(lambda: len(owned(a)) == 16)
    time.sleep(0.5)
    b = env.start(detector.publisher("b"), ownership=keeper(env, "b"))
    wait_until(lambda: len(owned(a)) == 8 and len(owned(b)) == 8, timeout=3 * TTL)
    assert not owned(a) & owned(b)
    time.sleep(1.0)

    env.stop(a, crash=True)
    crashed_at = time.monotonic()
    wait_until(lambda: len(owned(b)) == 16, timeout=3 * TTL)
    takeover = time.monotonic() - crashed_at
    assert takeover <= TTL + 0.3, f"took {takeover:.2f}s"
    time.sleep(0.5)
    writer.halt.set()
    writer.join()
    assert writer.error is None, writer.error
    wait_until(lambda: env.pending() == 0)
    env.stop(b)

    assert detector.overlaps == []
    first: dict[tuple[Any, int], tuple[str, float]] = {}
    by_instance: dict[tuple[str, Any], list[int]] = defaultdict(list)
    duplicates = []
    for instance, entry, at in detector.log:
        key = (entry.aggregate_id, entry.seq)
        by_instance[(instance, entry.aggregate_id)].append(entry.seq)
        if key in first:
            duplicates.append((key, first[key], instance, at))
        else:
            first[key] = (instance, at)
    emitted = {(agg, seq) for agg, seqs in env.emitted().items() for seq in seqs}
    assert set(first) == emitted  # every entry published (I1)
    for seqs in by_instance.values():
        assert seqs == sorted(set(seqs))  # in order, and never twice by one instance (I4)
    # Only the crash can cause duplicates: entries a published but did not trim.
    for _key, (who, _at), again_by, again_at in duplicates:
        assert (who, again_by) == ("a", "b") and again_at >= crashed_at
    assert writer.count > 300


def test_a_graceful_stop_hands_over_without_waiting_for_expiry(env: DispatchEnv) -> None:
    detector = OverlapDetector()
    a = env.start(detector.publisher("a"), ownership=keeper(env, "a"))
    b = env.start(detector.publisher("b"), ownership=keeper(env, "b"))
    wait_until(lambda: len(owned(a)) == 8 and len(owned(b)) == 8, timeout=3 * TTL)
    for i in range(40):
        env.write(f"agg{i % 10}", f"m{i}")
    wait_until(lambda: env.pending() == 0)
    env.stop(a)
    stopped_at = time.monotonic()
    assert MongoLeaseTable(env.db["leases"], "aggs").read().members.keys() == {b.ownership.owner}  # type: ignore[attr-defined]
    wait_until(lambda: len(owned(b)) == 16, timeout=3 * TTL)
    assert time.monotonic() - stopped_at < TTL  # released, not expired
    env.write("agg0", "after")
    wait_until(lambda: env.pending() == 0)
    assert detector.overlaps == []
    assert len({(e.aggregate_id, e.seq) for _, e, _ in detector.log}) == len(detector.log)


class CutOffTable(MongoLeaseTable):
    """A lease table that can be cut off, as in a network partition: every call fails."""

    cut = False

    def _check(self) -> None:
        if self.cut:
            raise TransientStoreError("lease table unreachable")

    def read(self) -> Any:
        self._check()
        return super().read()

    def join(self, owner: str, expires_at: datetime) -> None:
        self._check()
        super().join(owner, expires_at)

    def renew(self, partitions: Any, owner: str, expires_at: datetime) -> None:
        self._check()
        super().renew(partitions, owner, expires_at)

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        self._check()
        return super().acquire(partition, owner, now, expires_at)


def test_an_instance_that_cannot_renew_stops_before_another_takes_over(env: DispatchEnv) -> None:
    detector = OverlapDetector()
    writer = Writer(env, aggregates=30)
    writer.start()
    table = CutOffTable(env.db["leases"], "aggs")
    a = env.start(
        detector.publisher("a"),
        ownership=LeaseKeeper(table, partitions=16, owner="a", timing=LeaseTiming(ttl=TTL)),
    )
    b = env.start(detector.publisher("b"), ownership=keeper(env, "b"))
    wait_until(lambda: len(owned(a)) == 8 and len(owned(b)) == 8, timeout=3 * TTL)
    time.sleep(0.5)
    table.cut = True  # a keeps dispatching, but can no longer renew its leases
    wait_until(lambda: len(owned(b)) == 16, timeout=3 * TTL)
    assert owned(a) == frozenset()
    time.sleep(0.5)
    table.cut = False  # a is back: the partitions are shared again
    wait_until(lambda: len(owned(a)) == 8 and len(owned(b)) == 8, timeout=4 * TTL)
    writer.halt.set()
    writer.join()
    assert writer.error is None, writer.error
    wait_until(lambda: env.pending() == 0)
    assert detector.overlaps == []
    published = {(e.aggregate_id, e.seq) for _, e, _ in detector.log}
    assert published == {(agg, s) for agg, seqs in env.emitted().items() for s in seqs}


def lease_owners(env: DispatchEnv) -> dict[int, str]:
    now = datetime.now(UTC)
    view = MongoLeaseTable(env.db["leases"], "aggs").read()
    return {p: owner for p, (owner, expires) in view.leases.items() if expires > now}


def test_three_instances_settle_at_six_five_five_and_stay_settled(env: DispatchEnv) -> None:
    """16 partitions over 3 instances: floor or ceil each (6/5/5, not 6/6/4), reached by
    hand-overs from the most loaded, and then no lease changes hands."""
    detector = OverlapDetector()
    instances = []
    for name in "abc":
        instances.append(env.start(detector.publisher(name), ownership=keeper(env, name)))
        time.sleep(TTL / 2)

    def split() -> list[int]:
        return sorted((len(owned(d)) for d in instances), reverse=True)

    wait_until(lambda: split() == [6, 5, 5] and len(lease_owners(env)) == 16, timeout=8 * TTL)
    settled = lease_owners(env)
    assert sorted(Counter(settled.values()).values(), reverse=True) == [6, 5, 5]
    for _ in range(8):  # two TTLs: eight heartbeats of every instance
        time.sleep(TTL / 4)
        assert lease_owners(env) == settled
        assert split() == [6, 5, 5]
    for i in range(40):
        env.write(f"agg{i % 12}", f"m{i}")
    wait_until(lambda: env.pending() == 0)
    assert lease_owners(env) == settled
    assert detector.overlaps == []
