"""The dispatcher on Cosmos DB: change feed per feed range, checkpoints, sweeps, dead
letters and leases, on the session's account (the local server has several feed ranges)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, OutboxMessage
from docoutbox.dispatch.dispatcher import Dispatcher, DispatcherConfig
from docoutbox.dispatch.leases import LeaseTiming
from docoutbox.dispatch.ownership import LeaseKeeper, Ownership
from docoutbox.errors import ChangeStreamLost, PublishError
from docoutbox.testing import MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import (
    CosmosBackend,
    CosmosChangeSource,
    CosmosCheckpoints,
    CosmosDeadLetters,
    CosmosLeaseTable,
    encode_id,
)
from tests.integration.test_dispatcher_mongo import CONFIG, seqs_by_aggregate, wait_until
from tests.integration.test_leases_mongo import OverlapDetector
from tests.support.cosmos import create_container, scratch_database
from tests.support.servers import CosmosAccount

pytestmark = pytest.mark.cosmos

#: Longer than the MongoDB tests' 2 s: each held lease is renewed with its own request
#: (tests/README.md).
TTL = 4.0
NOW = datetime.now(UTC).replace(microsecond=0)


class CosmosEnv:
    """One fresh database, its containers, and dispatchers started over them."""

    def __init__(self, database: Any) -> None:
        self.db = database
        self.coll = create_container(database, "aggs")
        self.checkpoints = create_container(database, "checkpoints")
        self.dead = create_container(database, "dead")
        self.leases = create_container(database, "leases")
        self.store = AggregateStore(CosmosBackend(self.coll), Counter)
        self.running: list[tuple[Dispatcher, threading.Thread]] = []

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        outcome = self.store.handle(
            aggregate, add_msg(message_id, emits=emits), counter_handlers, create=True
        )
        assert outcome.applied

    def start(
        self,
        publisher: Any,
        *,
        ownership: Ownership | None = None,
        config: DispatcherConfig = CONFIG,
    ) -> Dispatcher:
        dispatcher = Dispatcher(
            CosmosBackend(self.coll),
            publisher,
            CosmosDeadLetters(self.dead),
            source=CosmosChangeSource(self.coll),
            checkpoints=CosmosCheckpoints(self.checkpoints),
            ownership=ownership,
            config=config,
        )
        thread = threading.Thread(target=dispatcher.run, daemon=True)
        thread.start()
        assert dispatcher.started.wait(10)
        self.running.append((dispatcher, thread))
        return dispatcher

    def stop(self, dispatcher: Dispatcher, *, crash: bool = False) -> None:
        for d, thread in self.running:
            if d is dispatcher:
                d.halt() if crash else d.stop()
                thread.join(15)
                assert not thread.is_alive()

    def _query(self, sql: str) -> list[Any]:
        return list(self.coll.query_items(sql, enable_cross_partition_query=True))

    def pending(self) -> int:
        return sum(self._query("SELECT VALUE ARRAY_LENGTH(c.outbox) FROM c"))

    def emitted(self) -> dict[str, list[int]]:
        rows = self._query("SELECT c.aid, c.outbox_seq FROM c")
        return {r["aid"]: list(range(1, r["outbox_seq"] + 1)) for r in rows}

    def checkpoint(self) -> Any:
        return CosmosCheckpoints(self.checkpoints).load(CONFIG.name)

    def close(self) -> None:
        for d, thread in self.running:
            d.stop()
            thread.join(15)


@pytest.fixture
def env(cosmos_server: CosmosAccount) -> Iterator[CosmosEnv]:
    with scratch_database(cosmos_server) as database:
        e = CosmosEnv(database)
        yield e
        e.close()


def test_change_feed_publishes_in_order_trims_and_checkpoints(env: CosmosEnv) -> None:
    publisher = MemoryPublisher()
    dispatcher = env.start(publisher)
    for i in range(40):
        env.write(f"a{i % 6}", f"m{i}", emits=2)
    wait_until(lambda: env.pending() == 0 and len(publisher.published) == 80)
    env.stop(dispatcher)
    assert seqs_by_aggregate(publisher.published) == env.emitted()
    position = env.checkpoint()
    ranges = list(env.coll.read_feed_ranges())
    assert position["v"] == 1 and len(position["ranges"]) == len(ranges)

    # Entries committed while no dispatcher runs are found by resuming from the checkpoint.
    for i in range(10):
        env.write(f"b{i % 3}", f"n{i}")
    second = MemoryPublisher()
    env.start(second)
    wait_until(lambda: env.pending() == 0)
    assert sorted(e.aggregate_id for e in second.published) == sorted(
        f"b{i % 3}" for i in range(10)
    )


def test_the_feed_is_read_per_feed_range(env: CosmosEnv) -> None:
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


def test_a_partly_done_page_is_resumed_from_before_the_page(env: CosmosEnv) -> None:
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


def test_unresumable_positions_are_classified_as_stream_loss(env: CosmosEnv) -> None:
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


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param("garbage", id="malformed-continuation"),
        pytest.param({"v": 1, "ranges": {"x": "y"}}, id="other-feed-ranges"),
        pytest.param(None, id="deleted"),
    ],
)
def test_a_lost_feed_position_is_recovered_by_a_sweep(env: CosmosEnv, damage: Any) -> None:
    publisher = MemoryPublisher()
    dispatcher = env.start(publisher)
    env.write("a", "m0")
    wait_until(lambda: env.pending() == 0 and env.checkpoint() is not None)
    env.stop(dispatcher)
    for i in range(12):
        env.write(f"p{i % 4}", f"while-down-{i}")
    checkpoints = CosmosCheckpoints(env.checkpoints)
    if damage is None:
        item_id = encode_id(CONFIG.name)
        env.checkpoints.delete_item(item_id, partition_key=item_id)
    elif damage == "garbage":
        saved = env.checkpoint()
        key = next(iter(saved["ranges"]))
        checkpoints.save(CONFIG.name, {"v": 1, "ranges": {**saved["ranges"], key: "garbage"}})
    else:
        checkpoints.save(CONFIG.name, damage)
    recovered = MemoryPublisher()
    env.start(recovered)
    wait_until(lambda: env.pending() == 0)
    assert sorted(e.seq for e in recovered.published if e.aggregate_id == "p0") == [1, 2, 3]
    assert len([e for e in recovered.published if str(e.aggregate_id).startswith("p")]) == 12
    env.write("after", "m-after")
    wait_until(lambda: env.pending() == 0)
    wait_until(lambda: env.checkpoint() not in (None, damage))


def test_a_poison_entry_goes_to_the_dead_letter_container(env: CosmosEnv) -> None:
    def refuse(entry: OutboxMessage) -> BaseException | None:
        return PublishError("refused by the broker") if entry.payload.get("n") == 13 else None

    publisher = MemoryPublisher(fail=refuse)
    env.start(publisher)
    env.write("a", "m0")
    env.store.handle("a", add_msg("poison", n=13), counter_handlers)
    env.write("a", "m2")
    env.write("b", "m3")
    wait_until(lambda: env.pending() == 0)
    [dead] = list(env.dead.query_items("SELECT * FROM c", enable_cross_partition_query=True))
    assert dead["aggregate_id"] == "a" and dead["entry"]["seq"] == 2
    assert "refused by the broker" in dead["error"] and dead["attempts"] == 2
    assert dead["entry_id"] == dead["entry"]["id"]
    assert seqs_by_aggregate(publisher.published) == {"a": [1, 3], "b": [1]}
    CosmosDeadLetters(env.dead).put("a", dead["entry"], "again", 9)  # idempotent
    assert (
        len(list(env.dead.query_items("SELECT * FROM c", enable_cross_partition_query=True))) == 1
    )


def test_checkpoints_round_trip(env: CosmosEnv) -> None:
    checkpoints = CosmosCheckpoints(env.checkpoints)
    assert checkpoints.load("x/y") is None
    checkpoints.save("x/y", {"v": 1, "ranges": {"a": "b"}})
    checkpoints.save("x/y", {"v": 1, "ranges": {"a": "c"}})
    assert checkpoints.load("x/y") == {"v": 1, "ranges": {"a": "c"}}


def test_lease_table_writes_are_conditional(env: CosmosEnv) -> None:
    table = CosmosLeaseTable(env.leases, "aggs")
    other_group = CosmosLeaseTable(env.leases, "other")
    soon, later = NOW + timedelta(seconds=5), NOW + timedelta(seconds=50)
    assert table.acquire(3, "a", NOW, soon)
    assert not table.acquire(3, "b", NOW, soon)  # held
    assert table.acquire(3, "a", NOW, later)  # the holder may re-acquire
    assert table.acquire(3, "b", later + timedelta(seconds=1), later)  # expired: taken over
    table.renew([3], "a", later + timedelta(days=1))  # not a's any more: no effect
    table.release(3, "a")  # not a's: no effect
    table.join("b", soon)
    view = table.read()
    assert view.leases == {3: ("b", later)}
    assert view.members == {"b": soon}
    assert other_group.read().leases == {}
    table.release(3, "b")
    table.leave("b")
    table.leave("b")  # leaving twice is harmless
    view = table.read()
    assert view.leases == {} and view.members == {}
    assert table.acquire(3, "c", NOW, soon)  # a released lease is free at once


def test_lease_races_have_one_winner(env: CosmosEnv) -> None:
    tables = [CosmosLeaseTable(env.leases, "aggs") for _ in range(6)]
    results: list[tuple[str, bool]] = []
    barrier = threading.Barrier(len(tables))

    def contend(i: int) -> None:
        barrier.wait()
        results.append((f"o{i}", tables[i].acquire(0, f"o{i}", NOW, NOW + timedelta(hours=1))))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(tables))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [owner for owner, won in results if won]
    assert len(winners) == 1
    assert tables[0].read().leases[0][0] == winners[0]


def keeper(env: CosmosEnv, owner: str) -> LeaseKeeper:
    return LeaseKeeper(
        CosmosLeaseTable(env.leases, "aggs"),
        partitions=16,
        owner=owner,
        timing=LeaseTiming(ttl=TTL),
    )


def owned(dispatcher: Dispatcher) -> frozenset[int]:
    scope = dispatcher.ownership.owned()
    assert scope is not None
    return scope


def test_two_instances_share_partitions_and_fail_over_after_a_crash(env: CosmosEnv) -> None:
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

    assert detector.overlaps == []
    published = {(e.aggregate_id, e.seq) for _, e, _ in detector.log}
    emitted = {(agg, seq) for agg, seqs in env.emitted().items() for seq in seqs}
    assert published == emitted  # every entry published (I1)
    by_instance: dict[tuple[str, Any], list[int]] = defaultdict(list)
    for instance, entry, _ in detector.log:
        by_instance[(instance, entry.aggregate_id)].append(entry.seq)
    for seqs in by_instance.values():
        assert seqs == sorted(set(seqs))  # in order, never twice by one instance (I4)


def test_a_split_feed_range_keeps_the_position_usable(
    env: CosmosEnv, cosmos_server: CosmosAccount
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


def test_the_asyncio_dispatcher_runs_on_the_aio_ports(
    env: CosmosEnv, cosmos_server: CosmosAccount
) -> None:
    """AsyncCosmosChangeSource, AsyncCosmosCheckpoints, AsyncCosmosDeadLetters and
    AsyncCosmosBackend under the asyncio driver: in order, trimmed, checkpointed, resumed."""
    from docoutbox.dispatch.aio import AsyncDispatcher
    from docoutbox.testing import AsyncMemoryPublisher
    from docoutbox_cosmos import (
        AsyncCosmosBackend,
        AsyncCosmosChangeSource,
        AsyncCosmosCheckpoints,
        AsyncCosmosDeadLetters,
    )

    def run(publisher: MemoryPublisher, until: Any) -> None:
        made: list[AsyncDispatcher] = []

        async def main() -> None:
            client = cosmos_server.async_client()
            db = client.get_database_client(env.db.id)
            aggs = db.get_container_client(env.coll.id)
            dispatcher = AsyncDispatcher(
                AsyncCosmosBackend(aggs),
                AsyncMemoryPublisher(publisher),
                AsyncCosmosDeadLetters(db.get_container_client(env.dead.id)),
                source=AsyncCosmosChangeSource(aggs),
                checkpoints=AsyncCosmosCheckpoints(db.get_container_client(env.checkpoints.id)),
                config=CONFIG,
            )
            made.append(dispatcher)
            try:
                await dispatcher.run()
            finally:
                await client.close()

        thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        thread.start()
        try:
            wait_until(lambda: bool(made) and made[0].started.is_set())
            wait_until(until)
        finally:
            if made:
                made[0].stop()
            thread.join(15)
        assert not thread.is_alive()

    first = MemoryPublisher()
    for i in range(20):
        env.write(f"a{i % 4}", f"m{i}", emits=2)
    run(first, lambda: env.pending() == 0 and len(first.published) == 40)
    assert seqs_by_aggregate(first.published) == env.emitted()
    saved = env.checkpoint()
    assert saved["v"] == 1 and len(saved["ranges"]) == len(list(env.coll.read_feed_ranges()))
    for i in range(8):
        env.write(f"b{i % 2}", f"n{i}")
    second = MemoryPublisher()
    run(second, lambda: env.pending() == 0)
    assert sorted(e.aggregate_id for e in second.published) == sorted(f"b{i % 2}" for i in range(8))
