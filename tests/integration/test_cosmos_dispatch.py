"""The dispatcher's Cosmos DB-specific behaviour: change feed per feed range, checkpoints
and partition leases, on the session's account (the local server has several feed ranges).
What every backend shares (stream, sweeps, dead letters, the lease table's writes, the
asyncio driver on the aio ports) is in ``test_dispatch_backends.py``."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.errors import ChangeStreamLost
from docoutbox.testing import MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.changes import CosmosChangeSource
from docoutbox_cosmos.coordination import CosmosCheckpoints, CosmosLeaseTable
from tests.support.backends import (
    PATIENT,
    PER_THREAD,
    THREADS,
    DispatchEnv,
    OverlapDetector,
    dispatch_env_of,
    owned,
    run_writers,
    wait_until,
)

pytestmark = pytest.mark.cosmos

#: Longer than the MongoDB tests' 2 s: each held lease is renewed with its own request
#: (tests/README.md).
TTL = 4.0
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    with dispatch_env_of("cosmos", request) as made:
        yield made


def test_the_feed_is_read_per_feed_range(env: DispatchEnv) -> None:
    source = CosmosChangeSource(env.coll)
    ranges = source.feed_ranges()
    marker = source.start_marker()
    assert set(marker["ranges"]) == set(ranges)
    for i in range(30):
        env.write(f"r{i}", f"m{i}")
    seen: dict[str, set[Any]] = defaultdict(set)
    for key, feed_range in ranges.items():
        single = CosmosChangeSource(env.coll, feed_ranges=[feed_range])
        single.open({"v": 1, "ranges": {key: marker["ranges"][key]}})
        while events := single.poll(100):
            seen[key] |= {e.document["_id"] for e in events if e.document}
    assert set().union(*seen.values()) == {f"r{i}" for i in range(30)}
    if len(ranges) > 1:
        assert sum(len(ids) for ids in seen.values()) == 30  # each item in one range only
        assert sum(1 for ids in seen.values() if ids) > 1


def test_a_partly_done_page_is_resumed_from_before_the_page(env: DispatchEnv) -> None:
    source = CosmosChangeSource(env.coll, feed_ranges=[next(iter(env.coll.read_feed_ranges()))])
    marker = source.start_marker()
    source.open(marker)
    for i in range(12):
        env.write(f"p{i}", f"m{i}")
    events = source.poll(3)
    assert 1 <= len(events) <= 3
    assert all(e.position == marker for e in events[:-1])
    assert events[-1].position != marker
    # Resuming from the position of any but the last event reads that page again.
    again = CosmosChangeSource(env.coll, feed_ranges=source._ranges)
    again.open(events[0].position)
    replay = again.poll(3)
    assert [e.document["_id"] for e in replay] == [e.document["_id"] for e in events]  # type: ignore[index]
    # Resuming from the last event's position goes on after the page.
    later = CosmosChangeSource(env.coll, feed_ranges=source._ranges)
    later.open(events[-1].position)
    rest = []
    while batch := later.poll(100):
        rest += [e.document["_id"] for e in batch if e.document]
    assert not {e.document["_id"] for e in events if e.document} & set(rest)


def test_unresumable_positions_are_classified_as_stream_loss(env: DispatchEnv) -> None:
    source = CosmosChangeSource(env.coll)
    marker = source.start_marker()
    key = next(iter(marker["ranges"]))
    other_keys = {"v": 1, "ranges": {"not-a-range": "x"}}
    for bad in [None, 42, {"x": 1}, {"v": 2, "ranges": {}}, other_keys]:
        with pytest.raises(ChangeStreamLost):
            source.open(bad)
    source.open({"v": 1, "ranges": {**marker["ranges"], key: "bm90IGEgdG9rZW4="}})
    with pytest.raises(ChangeStreamLost):
        source.poll(10)  # nothing new: one poll reads every range, the damaged one too


def test_checkpoints_round_trip(env: DispatchEnv) -> None:
    checkpoints = CosmosCheckpoints(env.bundle.checkpoints)
    assert checkpoints.load("x/y") is None
    checkpoints.save("x/y", {"v": 1, "ranges": {"a": "b"}})
    checkpoints.save("x/y", {"v": 1, "ranges": {"a": "c"}})
    assert checkpoints.load("x/y") == {"v": 1, "ranges": {"a": "c"}}


def keeper(env: DispatchEnv, owner: str) -> LeaseKeeper:
    return LeaseKeeper(
        CosmosLeaseTable(env.bundle.leases, "aggs"),
        partitions=16,
        owner=owner,
        timing=LeaseTiming(ttl=TTL),
    )


def test_two_instances_share_partitions_and_fail_over_after_a_crash(env: DispatchEnv) -> None:
    detector = OverlapDetector()
    a = env.start(detector.publisher("a"), ownership=keeper(env, "a"))
    wait_until(lambda: len(owned(a)) == 16)
    b = env.start(detector.publisher("b"), ownership=keeper(env, "b"))
    wait_until(lambda: len(owned(a)) == 8 and len(owned(b)) == 8, timeout=4 * TTL)
    assert not owned(a) & owned(b)
    for i in range(60):
        env.write(f"agg{i % 20}", f"w{i}")
    time.sleep(0.5)
    env.stop(a, crash=True)
    crashed_at = time.monotonic()
    for i in range(60, 100):
        env.write(f"agg{i % 20}", f"w{i}")
    wait_until(lambda: len(owned(b)) == 16, timeout=4 * TTL)
    # Expiry (one TTL), then the next heartbeat (TTL / 4), plus requests on a busy server.
    assert time.monotonic() - crashed_at <= TTL + TTL / 4 + 2.0
    wait_until(lambda: env.pending() == 0, timeout=30)
    env.stop(b)

    detector.assert_each_published_in_order(env.emitted())


def test_a_split_feed_range_keeps_the_position_usable(
    env: DispatchEnv, cosmos_server: CosmosAccount
) -> None:
    if not cosmos_server.emulated:
        pytest.skip("splitting a range on demand needs the local Cosmos DB server")
    source = CosmosChangeSource(env.coll)
    marker = source.start_marker()
    for i in range(20):
        env.write(f"before{i}", f"m{i}")
    range_id = "1"
    cosmos_server.split_feed_range(env.db.id, env.coll.id, range_id)
    assert len(list(env.coll.read_feed_ranges(force_refresh=True))) == len(marker["ranges"]) + 1
    for i in range(20):
        env.write(f"after{i}", f"n{i}")
    resumed = CosmosChangeSource(env.coll)
    resumed.open(marker)  # the parent range's continuation still stands for its children
    seen: set[Any] = set()
    while events := resumed.poll(100):
        seen |= {e.document["_id"] for e in events if e.document}
    assert seen == {f"before{i}" for i in range(20)} | {f"after{i}" for i in range(20)}


def _published_in_order(publisher: MemoryPublisher) -> dict[str, int]:
    """ID -> seq of every published entry; first publications in ``seq`` order (I4)."""
    first: dict[str, int] = {}
    for entry in publisher.published:
        first.setdefault(entry.id, entry.seq)
    seqs = list(first.values())
    assert seqs == sorted(seqs)
    return first


def test_eight_writers_on_one_aggregate_with_a_trimming_dispatcher(env: DispatchEnv) -> None:
    """8 threads x 200 messages on one aggregate while the dispatcher publishes from the
    feed's copies and trims at their positions: version 1600, seq 1..1600 without gaps,
    every commit applied (no trim failed one), every entry published, none left."""
    publisher = MemoryPublisher()
    env.start(publisher)

    def store_for() -> AggregateStore[Counter]:
        return AggregateStore(CosmosBackend(env.coll), Counter, PATIENT)

    store_for().create("hot", Counter())
    outcomes = run_writers(store_for, THREADS, PER_THREAD)
    total = THREADS * PER_THREAD
    assert all(o.applied for o in outcomes)
    assert sorted(o.version for o in outcomes) == list(range(1, total + 1))
    emitted = {e.id: e.seq for o in outcomes for e in o.emitted}
    assert sorted(emitted.values()) == list(range(1, total + 1))
    wait_until(lambda: env.pending() == 0 and len(set(publisher.ids())) == total, 120)
    assert _published_in_order(publisher) == emitted
    final = store_for().get("hot")
    assert (final.version, final.outbox_seq, len(final.outbox)) == (total, total, 0)


def test_a_trimming_dispatcher_never_makes_a_commit_retry(env: DispatchEnv) -> None:
    """One writer, so any conflict could only come from a trim: there is none (I3)."""
    publisher = MemoryPublisher()
    env.start(publisher)
    store = AggregateStore(CosmosBackend(env.coll), Counter)
    store.create("solo", Counter())
    outcomes = [store.handle("solo", add_msg(f"m{i}"), counter_handlers) for i in range(150)]
    assert [o.attempts for o in outcomes] == [1] * 150
    wait_until(lambda: env.pending() == 0 and len(set(publisher.ids())) == 150, 60)
    assert sorted(_published_in_order(publisher).values()) == list(range(1, 151))
    assert store.get("solo").version == 150
