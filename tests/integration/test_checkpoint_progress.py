"""The checkpoint keeps advancing while producers commit continuously, on the MongoDB wire
server (the resume token in the checkpoints collection) and on Cosmos DB with feed-range
leases (each range's continuation in its lease), with the threaded and the asyncio
dispatcher: across a clean restart (MongoDB), and while a second instance shares the feed
ranges and then takes the first one's over (Cosmos DB).

Traffic goes to a handful of hot aggregates (requests keep arriving while their runs are
under way) and to new aggregates. The first start on MongoDB is a fresh start over a
backlog, so its checkpoint waits behind the gate of a sweep that keeps finding new
documents. The in-memory twins, with a stronger check, are in
``tests/unit/test_checkpoint_progress.py`` (simulated clock) and
``tests/integration/test_checkpoint_progress_memory.py`` (threads and asyncio).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from docoutbox import OutboxMessage
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.errors import PublishError
from docoutbox.testing import MemoryPublisher
from tests.integration.test_cosmos_leases import LeaseEnv
from tests.support.backends import (
    CONFIG,
    CosmosBundle,
    DispatchEnv,
    bundle_of,
    dispatch_env_of,
    wait_until,
)
from tests.support.checkpointing import BOUND, HotTraffic, wait_each_moves

#: The tests' usual configuration, checkpointing every quarter second.
PROGRESS = replace(CONFIG, checkpoint_interval=0.25)


@pytest.fixture(params=["threaded", "pymongo-async"])
def mongo_env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    with dispatch_env_of("mongo", request, request.param) as env:
        yield env


@pytest.mark.wire
def test_mongo_checkpoint_keeps_moving_under_continuous_traffic(mongo_env: DispatchEnv) -> None:
    env = mongo_env
    for i in range(60):
        env.write(f"old{i:03d}", f"old-{i}")  # the first start sweeps them behind a gate
    traffic = HotTraffic(env.write).start(threads=2, pause=0.001)
    publisher = MemoryPublisher()
    try:
        first = env.start(publisher, config=PROGRESS)

        def read() -> dict[str, Any]:
            return {"token": env.checkpoint()}

        took = wait_each_moves(read, ["token"], rounds=3, traffic=traffic)
        env.stop(first)
        env.start(publisher, config=PROGRESS)  # resumes from the checkpoint
        took += wait_each_moves(read, ["token"], rounds=2, traffic=traffic)
    finally:
        traffic.stop()
    print(f"checkpoint rounds (s): {[round(t, 2) for t in took]}, commands {traffic.commands}")
    wait_until(lambda: env.pending() == 0, timeout=60)
    published = {(str(e.aggregate_id), e.seq) for e in publisher.published}
    assert published >= {(a, s) for a, seqs in env.emitted().items() for s in seqs}


@pytest.fixture(params=["threaded", "asyncio"])
def lease_env(request: pytest.FixtureRequest) -> Iterator[LeaseEnv]:
    with bundle_of("cosmos", request) as bundle:
        assert isinstance(bundle, CosmosBundle)
        env = LeaseEnv(bundle, request.param)
        try:
            yield env
        finally:
            env.close()


@pytest.mark.cosmos
def test_cosmos_lease_continuations_keep_moving_under_continuous_traffic(
    lease_env: LeaseEnv,
) -> None:
    env = lease_env
    ranges = env.table().partitions
    # One hot aggregate per feed range, so every lease has traffic of its own.
    hot = [env.aggregates_in(p, 1)[0] for p in range(ranges)]
    for i in range(300):
        env.write(f"aged{i:03d}", f"aged-{i}")  # leases taken from "now": swept meanwhile
    traffic = HotTraffic(env.write, hot=hot).start(threads=2, pause=0.001)
    publisher = MemoryPublisher()

    def read() -> dict[int, Any]:
        return {p: env.lease(p).get("continuation") for p in range(ranges)}

    def owners() -> set[str]:
        return {str(env.lease(p).get("owner")) for p in range(ranges)}

    try:
        first = env.start_leased(publisher, "a", PROGRESS)
        wait_until(lambda: all(read().values()), timeout=BOUND)
        took = wait_each_moves(read, range(ranges), rounds=3, traffic=traffic)
        # A second instance: the ranges are split, each instance checkpoints its own.
        env.start_leased(publisher, "b", PROGRESS)
        wait_until(lambda: len(owners()) == 2, timeout=BOUND)
        took += wait_each_moves(read, range(ranges), rounds=2, traffic=traffic)
        # The first one stops: the other takes its ranges over from their continuations.
        env.stop(first)
        wait_until(lambda: owners() == {"b"}, timeout=BOUND)
        took += wait_each_moves(read, range(ranges), rounds=2, traffic=traffic)
    finally:
        traffic.stop()
    print(f"checkpoint rounds (s): {[round(t, 2) for t in took]}, commands {traffic.commands}")
    wait_until(lambda: env.pending() == 0, timeout=60)
    published = {(str(e.aggregate_id), e.seq) for e in publisher.published}
    assert published >= {(a, s) for a, seqs in env.emitted().items() for s in seqs}


@pytest.mark.cosmos
def test_a_feed_range_whose_entry_cannot_be_published_holds_back_its_own_continuation_only(
    lease_env: LeaseEnv,
) -> None:
    """Each feed range is a lane: an unfinished event holds back its own range's
    continuation, and the others keep moving (one position for all held them all)."""
    env = lease_env
    ranges = env.table().partitions
    stuck = env.aggregates_in(0, 1)[0]
    others = [env.aggregates_in(p, 1)[0] for p in range(1, ranges)]
    refusing = threading.Event()
    refusing.set()
    attempts: list[str] = []

    def nack(entry: OutboxMessage) -> BaseException | None:
        if refusing.is_set() and entry.aggregate_id == stuck:
            attempts.append(entry.id)
            return PublishError("the broker refused it")
        return None

    publisher = MemoryPublisher(fail=nack)
    retrying = DispatchPolicy(max_attempts=1_000_000, base_delay=0.02, max_delay=0.1)
    env.start_leased(publisher, "a", replace(PROGRESS, policy=retrying))

    def continuations() -> dict[int, Any]:
        return {p: env.lease(p).get("continuation") for p in range(ranges)}

    wait_until(lambda: all(continuations().values()), timeout=BOUND)
    env.write(stuck, "stuck-1")
    wait_until(lambda: len(attempts) >= 2, timeout=BOUND)
    time.sleep(4 * PROGRESS.checkpoint_interval)  # what range 0 may still save is saved
    before = continuations()
    for n in range(3):
        for aggregate in others:
            env.write(aggregate, f"{aggregate}-{n}")
    wait_until(
        lambda: all(continuations()[p] != before[p] for p in range(1, ranges)), timeout=BOUND
    )
    assert continuations()[0] == before[0]
    refusing.clear()
    wait_until(lambda: continuations()[0] != before[0], timeout=BOUND)
    wait_until(lambda: env.pending() == 0, timeout=60)
