"""Feed-range leases on Cosmos DB: one lease item per feed range carrying its owner,
continuation and timestamp, written under ETag conditions; several dispatcher instances
split the ranges, and one takes a crashed instance's ranges over within a TTL, resuming
from their stored continuations (the local server has four feed ranges)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.errors import ChangeStreamLost, TransientStoreError
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.changes import CosmosChangeSource, now_token, range_key
from docoutbox_cosmos.coordination import CosmosDeadLetters
from docoutbox_cosmos.items import encode_id
from docoutbox_cosmos.leases import CosmosFeedRangeLeases, LeasedChangeSource
from tests.support.backends import (
    CONFIG,
    CosmosBundle,
    DispatchEnv,
    OverlapDetector,
    bundle_of,
    owned,
    wait_until,
)

pytestmark = pytest.mark.cosmos

#: As in test_cosmos_dispatch.py: each held lease is renewed with its own request.
TTL = 4.0
NOW = datetime.now(UTC).replace(microsecond=0)
SOON, LATER = NOW + timedelta(seconds=5), NOW + timedelta(seconds=50)


class LeaseEnv(DispatchEnv):
    """Dispatchers over a Cosmos DB bundle that lease its feed ranges in its lease
    container, the lease items being their checkpoints."""

    def __init__(self, bundle: CosmosBundle, driver: str = "threaded") -> None:
        super().__init__(bundle, driver)
        self.lease_coll = bundle.leases
        self._by_range: dict[int, list[str]] = defaultdict(list)
        self._next = 0

    def table(self) -> CosmosFeedRangeLeases:
        return CosmosFeedRangeLeases(self.lease_coll, self.coll, "aggs")

    def aggregates_in(self, partition: int, count: int) -> list[str]:
        """``count`` aggregate IDs whose items fall in the feed range ``partition``."""
        table = self.table()
        while len(self._by_range[partition]) < count:
            aid = f"r{self._next}"
            self._by_range[table.locate({"_id": aid})].append(aid)
            self._next += 1
        return self._by_range[partition][:count]

    def lease(self, partition: int) -> dict[str, Any]:
        item_id = encode_id(f"aggs/range/{partition}")
        item: dict[str, Any] = self.lease_coll.read_item(item_id, partition_key=item_id)
        return item

    def start_leased(
        self, publisher: Any, owner: str, config: DispatcherConfig = CONFIG
    ) -> Dispatcher | AsyncDispatcher:
        """A dispatcher whose source and checkpoints are the feed-range leases (sync: the
        asyncio driver calls them in threads) and whose ownership keeps them."""
        table = self.table()
        keeper = LeaseKeeper(
            table, partitions=table.partitions, owner=owner, timing=LeaseTiming(ttl=TTL)
        )
        return self.start(
            publisher,
            ownership=keeper,
            source=LeasedChangeSource(self.coll, table),
            checkpoints=table,
            config=config,
        )


@pytest.fixture
def env(request: pytest.FixtureRequest) -> Iterator[LeaseEnv]:
    with bundle_of("cosmos", request) as bundle:
        assert isinstance(bundle, CosmosBundle)
        e = LeaseEnv(bundle)
        yield e
        e.close()


@pytest.fixture(params=["threaded", "asyncio"])
def drivers_env(request: pytest.FixtureRequest) -> Iterator[LeaseEnv]:
    with bundle_of("cosmos", request) as bundle:
        assert isinstance(bundle, CosmosBundle)
        e = LeaseEnv(bundle, request.param)
        yield e
        e.close()


def test_one_lease_item_per_feed_range_with_owner_continuation_and_timestamp(
    env: LeaseEnv,
) -> None:
    table = env.table()
    ranges = list(env.coll.read_feed_ranges())
    assert table.partitions == len(ranges) > 1
    assert sorted(table.range_keys()) == sorted(range_key(r) for r in ranges)
    assert env.table().ranges() == table.ranges()  # fixed, shared by every instance
    assert table.acquire(1, "a", NOW, SOON)
    lease = env.lease(1)
    assert lease["owner"] == "a" and lease["range"] == table.ranges()[1]
    assert isinstance(lease["continuation"], str) and lease["timestamp"]
    assert table.held() == {1: lease["continuation"]}
    assert not table.acquire(len(ranges), "a", NOW, SOON)  # no such feed range


def test_locate_names_the_feed_range_whose_change_feed_carries_the_item(
    env: LeaseEnv,
) -> None:
    table = env.table()
    starts = {p: now_token(env.coll, r) for p, r in enumerate(table.ranges())}
    for i in range(24):
        env.write(f"loc{i}", f"m{i}")
    keys, seen = table.range_keys(), 0
    for p, feed_range in enumerate(table.ranges()):
        single = CosmosChangeSource(env.coll, feed_ranges=[feed_range])
        single.open({"v": 1, "ranges": {keys[p]: starts[p]}})
        while events := single.poll(100):
            for event in events:
                assert event.document is not None
                assert table.locate(event.document) == p
                seen += 1
    assert seen == 24


def test_items_the_leased_feed_delivers_are_located_without_hashing(env: LeaseEnv) -> None:
    table = env.table()
    for p in range(table.partitions):
        assert table.acquire(p, "a", NOW, LATER)
    source = LeasedChangeSource(env.coll, table)
    source.open(table.load("disp"))
    for i in range(12):
        env.write(f"h{i}", f"m{i}")
    events: list[Any] = []
    while batch := source.poll(100):
        events += [e for e in batch if e.document]
    assert len(events) == 12
    expected = {e.document["_id"]: env.table().locate(e.document) for e in events}

    class NoHashing:
        def feed_range_from_partition_key(self, pk: Any) -> Any:
            raise AssertionError(f"hashed {pk!r}")

    table.monitored = NoHashing()
    assert {e.document["_id"]: table.locate(e.document) for e in events} == expected


def test_a_taken_over_range_resumes_from_its_lease_continuation(env: LeaseEnv) -> None:
    first, rest = env.aggregates_in(0, 2), env.aggregates_in(0, 5)[2:]
    a = env.table()
    assert a.acquire(0, "a", NOW, SOON)
    source = LeasedChangeSource(env.coll, a)
    source.open(a.load("disp"))
    for i, aid in enumerate(first):
        env.write(aid, f"early{i}")
    events = source.poll(100)
    assert {e.document["_id"] for e in events if e.document} == set(first)
    a.save("disp", events[-1].position)  # a's checkpoint: past `first`
    for i, aid in enumerate(rest):
        env.write(aid, f"late{i}")
    # a stops renewing (crashed); b takes the expired lease over and resumes where a was.
    b = env.table()
    assert b.acquire(0, "b", SOON + timedelta(seconds=1), LATER)
    assert env.lease(0)["owner"] == "b"
    taken = LeasedChangeSource(env.coll, b)
    taken.open(b.load("disp"))
    resumed: list[Any] = []
    while batch := taken.poll(100):
        resumed += [e.document["_id"] for e in batch if e.document]
    assert sorted(resumed) == sorted(rest)  # nothing of `first` again, nothing lost


def test_a_stolen_lease_etag_stops_its_old_owner(env: LeaseEnv) -> None:
    a, b = env.table(), env.table()
    assert a.acquire(2, "a", NOW, SOON)
    a.renew([2], "a", SOON)  # renewals go under the ETag of a's last write
    source = LeasedChangeSource(env.coll, a)
    source.open(a.load("disp"))
    source.poll(10)
    assert set(source._tokens or {}) == {a.range_keys()[2]}
    stale = {"v": 1, "ranges": {a.range_keys()[2]: a.held()[2]}}
    assert b.acquire(2, "b", SOON + timedelta(seconds=1), LATER)  # a's lease expired
    b.save("disp", {"v": 1, "ranges": {b.range_keys()[2]: "b-continuation"}})
    # a, back from a pause, renews and checkpoints with the ETag it holds: 412, so it
    # lets the range go instead of overwriting b's lease.
    a.renew([2], "a", LATER + timedelta(seconds=10))
    a.save("disp", stale)
    lease = env.lease(2)
    assert (lease["owner"], lease["continuation"]) == ("b", "b-continuation")
    assert b.read().leases[2] == ("b", LATER)  # a's renewal did not extend it
    assert a.held() == {}
    source.poll(10)
    assert source._tokens == {}  # a no longer reads b's range
    a.release(2, "a")
    assert env.lease(2)["owner"] == "b"


def test_a_lease_written_by_a_lost_reply_is_still_its_owners(
    env: LeaseEnv, cosmos_server: CosmosAccount
) -> None:
    if not cosmos_server.emulated:
        pytest.skip("losing a reply on demand needs the local Cosmos DB server")
    a = env.table()
    assert a.acquire(1, "a", NOW, SOON)
    cosmos_server.inject_fault(method="PATCH", pathContains="range", dropReply=True)
    try:
        with pytest.raises(TransientStoreError):
            a.renew([1], "a", LATER)  # applied, but its reply (and new ETag) lost
    finally:
        cosmos_server.clear_faults()
    assert a.held().keys() == {1}
    # The next renewal's ETag is stale (412), yet the lease is still a's: a keeps it.
    a.renew([1], "a", LATER + timedelta(seconds=1))
    assert a.held().keys() == {1}
    assert a.read().leases[1] == ("a", LATER + timedelta(seconds=1))


def test_a_refused_range_restarts_from_now_and_is_reported_alone(
    env: LeaseEnv, cosmos_server: CosmosAccount
) -> None:
    if not cosmos_server.emulated:
        pytest.skip("injected faults need the local Cosmos DB server")
    table = env.table()
    for p in range(table.partitions):
        assert table.acquire(p, "a", NOW, LATER)
    source = LeasedChangeSource(env.coll, table)
    source.open(table.load("disp"))
    assert source.poll(10) == []
    written = [f"x{i}" for i in range(16)]
    for aid in written:
        env.write(aid, f"m-{aid}")
    cosmos_server.inject_fault(method="GET", headers={"a-im": "Incremental feed"}, status=410)
    with pytest.raises(ChangeStreamLost) as lost:
        source.poll(100)  # the first range read is refused: nothing was read before it
    assert lost.value.partitions is not None and len(lost.value.partitions) == 1
    [p] = lost.value.partitions
    seen: list[Any] = []
    while events := source.poll(100):
        seen += [e.document["_id"] for e in events if e.document]
    # That range restarted from now (its items are left to the sweep); the others go on.
    assert sorted(seen) == sorted(a for a in written if table.locate({"_id": a}) != p)
    assert any(table.locate({"_id": a}) == p for a in written)


def test_instances_split_the_feed_ranges_and_take_over_a_crashed_ones(
    drivers_env: LeaseEnv,
) -> None:
    env = drivers_env
    detector = OverlapDetector()
    ranges = env.table().partitions
    a = env.start_leased(detector.publisher("a"), "a")
    wait_until(lambda: len(owned(a)) == ranges)
    b = env.start_leased(detector.publisher("b"), "b")
    wait_until(lambda: len(owned(a)) == len(owned(b)) == ranges // 2, timeout=4 * TTL)
    assert not owned(a) & owned(b)
    for i in range(40):
        env.write(f"agg{i % 16}", f"w{i}")
    wait_until(lambda: env.pending() == 0)
    orphaned = owned(a)
    saved = {p: env.lease(p)["continuation"] for p in orphaned}
    env.stop(a, crash=True)  # no checkpoint, no release
    crashed_at = time.monotonic()
    for i in range(40, 80):
        env.write(f"agg{i % 16}", f"w{i}")
    wait_until(lambda: len(owned(b)) == ranges, timeout=4 * TTL)
    # Expiry (one TTL), then the next heartbeat (TTL / 4), plus requests on a busy server.
    assert time.monotonic() - crashed_at <= TTL + TTL / 4 + 2.0
    wait_until(lambda: env.pending() == 0, timeout=30)
    env.stop(b)

    detector.assert_each_published_in_order(env.emitted())
    for p in orphaned:
        lease = env.lease(p)
        assert lease["owner"] is None  # b stopped cleanly: released
        assert lease["continuation"] != saved[p]  # b went on from a's continuation


def test_three_instances_settle_at_two_one_one_and_stay_settled(env: LeaseEnv) -> None:
    """Four feed ranges over three instances: 2/1/1 (not 2/2/0), the third one getting a
    range handed over by the most loaded; then no lease changes hands."""
    ranges = env.table().partitions
    assert ranges == 4
    detector = OverlapDetector()
    instances = [env.start_leased(detector.publisher(name), name) for name in "abc"]

    def split() -> list[int]:
        return sorted((len(owned(d)) for d in instances), reverse=True)

    def owners() -> dict[int, Any]:
        return {p: env.lease(p)["owner"] for p in range(ranges)}

    wait_until(lambda: split() == [2, 1, 1], timeout=6 * TTL)
    wait_until(lambda: None not in owners().values(), timeout=2 * TTL)
    settled = owners()
    for _ in range(6):  # a TTL and a half: six heartbeats of every instance
        time.sleep(TTL / 4)
        assert owners() == settled
        assert split() == [2, 1, 1]
    for i in range(24):
        env.write(f"s{i % 8}", f"m{i}")
    wait_until(lambda: env.pending() == 0, timeout=30)
    assert owners() == settled
    assert detector.overlaps == []
    published = {(e.aggregate_id, e.seq) for _, e, _ in detector.log}
    assert published == {(a, s) for a, seqs in env.emitted().items() for s in seqs}


class CountingBackend(CosmosBackend):
    """Counts the sweep queries (``find_pending`` without a grace period)."""

    sweeps = 0

    def find_pending(self, **kwargs: Any) -> Any:
        if kwargs.get("older_than") is None:
            type(self).sweeps += 1
        return super().find_pending(**kwargs)


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "first-use"])
def test_a_range_acquired_with_a_stored_continuation_is_not_swept(
    env: LeaseEnv, stored: bool
) -> None:
    """Every pending entry of a range is after its stored continuation (I5): the new owner
    reads it from the feed without a sweep. A lease's first use has no continuation (it
    starts from now): that acquisition is swept."""
    table = env.table()
    if stored:  # a previous owner held every range and released them cleanly
        for p in range(table.partitions):
            assert table.acquire(p, "before", NOW, LATER)
            table.release(p, "before")
    for i in range(12):
        env.write(f"c{i}", f"m{i}")  # after the stored continuations, before any sweep

    class Counting(CountingBackend):
        sweeps = 0

    detector = OverlapDetector()
    leases = env.table()
    keeper = LeaseKeeper(
        leases, partitions=leases.partitions, owner="a", timing=LeaseTiming(ttl=TTL)
    )
    dispatcher = Dispatcher(
        Counting(env.coll),
        detector.publisher("a"),
        CosmosDeadLetters(env.bundle.dead),  # type: ignore[attr-defined]
        source=LeasedChangeSource(env.coll, leases),
        checkpoints=leases,
        ownership=keeper,
        config=CONFIG,
    )
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    assert dispatcher.started.wait(10)
    env.running.append((dispatcher, thread))
    wait_until(lambda: len(owned(dispatcher)) == table.partitions)
    wait_until(lambda: env.pending() == 0, timeout=30)
    emitted = {(a, s) for a, seqs in env.emitted().items() for s in seqs}
    assert {(e.aggregate_id, e.seq) for _, e, _ in detector.log} == emitted
    # One acquisition (one tick took every range): one sweep query without a stored
    # continuation, none with one.
    assert Counting.sweeps == (0 if stored else 1)


def test_a_continuation_is_stored_only_under_the_current_clean_holding(
    env: LeaseEnv, cosmos_server: CosmosAccount
) -> None:
    """What makes skipping the sweep safe: a range's continuation is written only while its
    holder says it is checkpointable, only from positions read under the current
    acquisition, and never again once the range's feed restarted from now."""
    table = env.table()
    clean = {p: True for p in range(table.partitions)}
    usable = dict(clean)
    table.guard_checkpoints(lambda p: clean[p], lambda p: usable[p])
    for p in range(table.partitions):
        assert table.acquire(p, "a", NOW, LATER)
        assert not table.resumes(p)  # first use: started from now, to be swept
    source = LeasedChangeSource(env.coll, table)
    source.open(table.load("disp"))
    assert source.poll(10) == []
    aid = env.aggregates_in(1, 1)[0]
    env.write(aid, "m1")
    events = [e for e in source.poll(100) if e.document]
    assert [e.document["_id"] for e in events] == [aid]
    position, before = events[-1].position, env.lease(1)["continuation"]
    key = table.range_keys()[1]

    clean[1] = False  # e.g. being handed over: events of it may be passed over
    table.save("disp", position)
    assert env.lease(1)["continuation"] == before
    clean[1] = True
    table.release(1, "a")  # released and acquired again: a new holding
    assert table.acquire(1, "a", NOW, LATER) and table.resumes(1)
    table.save("disp", position)  # read under the earlier holding
    assert env.lease(1)["continuation"] == before
    assert [e.document["_id"] for e in source.poll(100) if e.document] == [aid]  # from the lease's
    table.save("disp", source._position())
    assert env.lease(1)["continuation"] != before
    assert source._position()["ranges"][key] == env.lease(1)["continuation"]

    usable[1] = False  # acquired, but not in use by its holder yet: its feed is not read
    table.release(1, "a")
    assert table.acquire(1, "a", NOW, LATER)
    source.poll(100)
    assert key not in (source._tokens or {})
    usable[1] = True
    source.poll(100)
    assert key in (source._tokens or {})  # from the lease's continuation on

    if not cosmos_server.emulated:
        return
    stored = {p: env.lease(p)["continuation"] for p in range(table.partitions)}
    cosmos_server.inject_fault(method="GET", headers={"a-im": "Incremental feed"}, status=410)
    try:
        with pytest.raises(ChangeStreamLost) as lost:
            source.poll(100)
    finally:
        cosmos_server.clear_faults()
    assert lost.value.partitions is not None
    [refused] = lost.value.partitions
    restarted = source._position()
    refused_key = table.range_keys()[refused]
    assert restarted["ranges"][refused_key] != stored[refused]
    table.save("disp", restarted)  # restarted from now: its events are left to a sweep
    assert env.lease(refused)["continuation"] == stored[refused]
