"""The dispatcher on every database backend and driver: stream (change stream or change
feed), checkpoints, recovery sweeps, dead letters, and the lease table's writes.

MongoDB runs on the wire server (threaded, ``AsyncMongoClient`` and Motor drivers); Cosmos
DB on the session's account (threaded on azure-cosmos, asyncio on ``azure.cosmos.aio``).
Backend-specific tests stay in ``test_dispatcher_mongo.py`` and ``test_cosmos_dispatch.py``.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox import OutboxMessage
from docoutbox.errors import PublishError
from docoutbox.testing import MemoryPublisher
from docoutbox.testing.contract import add_msg, counter_handlers
from tests.support.backends import (
    Bundle,
    CosmosBundle,
    DispatchEnv,
    MongoBundle,
    seqs_by_aggregate,
    wait_until,
)

NOW = datetime.now(UTC).replace(microsecond=0)


def test_stream_publishes_in_order_trims_and_checkpoints(dispatch_env: DispatchEnv) -> None:
    env = dispatch_env
    # Committed before the first start (no position yet): found by the start's sweep.
    for i in range(8):
        env.write(f"s{i % 2}", f"before{i}", emits=2)
    publisher = MemoryPublisher()
    dispatcher = env.start(publisher)
    for i in range(40):
        env.write(f"a{i % 6}", f"m{i}", emits=2)
    wait_until(lambda: env.pending() == 0 and len(publisher.published) == 96)
    env.stop(dispatcher)
    assert seqs_by_aggregate(publisher.published) == env.emitted()
    env.bundle.assert_position(env.checkpoint())

    # Entries committed while no dispatcher runs are found by resuming from the
    # checkpoint (a single instance does not sweep when it has a usable checkpoint).
    for i in range(10):
        env.write(f"b{i % 3}", f"n{i}")
    second = MemoryPublisher()
    env.start(second)
    wait_until(lambda: env.pending() == 0)
    assert sorted(e.aggregate_id for e in second.published) == sorted(
        f"b{i % 3}" for i in range(10)
    )


def _damages() -> list[Any]:
    cases = []
    for kind, drivers, bundle in [
        ("mongo", ["threaded", "pymongo-async", "motor"], MongoBundle),
        ("cosmos", ["threaded"], CosmosBundle),
    ]:
        mark = pytest.mark.wire if kind == "mongo" else pytest.mark.cosmos
        for driver in drivers:
            for damage in [*bundle.DAMAGES, "deleted"]:
                cases.append(
                    pytest.param((kind, driver), damage, id=f"{kind}-{driver}-{damage}", marks=mark)
                )
    return cases


@pytest.mark.parametrize(("dispatch_env", "damage"), _damages(), indirect=["dispatch_env"])
def test_a_lost_stream_position_is_recovered_by_a_sweep(
    dispatch_env: DispatchEnv, damage: str
) -> None:
    env = dispatch_env
    publisher = MemoryPublisher()
    dispatcher = env.start(publisher)
    env.write("a", "m0")
    wait_until(lambda: env.pending() == 0 and env.checkpoint() is not None)
    env.stop(dispatcher)
    for i in range(12):
        env.write(f"p{i % 4}", f"while-down-{i}")
    # A fresh stream starts after these writes: only the sweep can see the entries
    # written while no dispatcher ran.
    time.sleep(env.bundle.fresh_start_delay)
    env.bundle.damage_checkpoint(damage)
    damaged = env.checkpoint()
    recovered = MemoryPublisher()
    env.start(recovered, **env.bundle.fresh_start_options)
    wait_until(lambda: env.pending() == 0)
    assert sorted(e.seq for e in recovered.published if e.aggregate_id == "p0") == [1, 2, 3]
    assert len([e for e in recovered.published if str(e.aggregate_id).startswith("p")]) == 12
    if env.bundle.exact_recovery:
        assert len(recovered.published) == 12
    # The stream works again from the fresh position, and the position is saved.
    env.write("after", "m-after")
    wait_until(lambda: env.pending() == 0)
    wait_until(lambda: env.checkpoint() not in (None, damaged))


def test_a_poison_entry_goes_to_the_dead_letters(dispatch_env: DispatchEnv) -> None:
    env = dispatch_env

    def refuse(entry: OutboxMessage) -> BaseException | None:
        return PublishError("refused by the broker") if entry.payload.get("n") == 13 else None

    publisher = MemoryPublisher(fail=refuse)
    env.start(publisher)
    env.write("a", "m0")
    env.store.handle("a", add_msg("poison", n=13), counter_handlers)
    env.write("a", "m2")
    env.write("b", "m3")
    wait_until(lambda: env.pending() == 0)
    [dead] = env.bundle.dead_items()
    assert dead["aggregate_id"] == "a" and dead["entry"]["seq"] == 2
    assert "refused by the broker" in dead["error"] and dead["attempts"] == 2
    assert dead[env.bundle.dead_id_field] == dead["entry"]["id"]
    assert seqs_by_aggregate(publisher.published) == {"a": [1, 3], "b": [1]}
    env.bundle.ports().dead_letters.put("a", dead["entry"], "again", 9)  # idempotent by ID
    assert len(env.bundle.dead_items()) == 1


def test_lease_table_writes_are_conditional(bundle: Bundle) -> None:
    table = bundle.lease_table("aggs")
    other_group = bundle.lease_table("other")
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


def test_lease_races_have_one_winner(bundle: Bundle) -> None:
    tables = [bundle.lease_table("aggs") for _ in range(6)]
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
