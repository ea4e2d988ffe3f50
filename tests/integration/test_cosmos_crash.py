"""kill -9 one of two leased dispatcher processes on Cosmos DB, again and again.

Two ``python -m docoutbox_app dispatch --cosmos-endpoint ...`` instances share the producers'
container through feed-range leases in a Cosmos lease container (one lease per feed range,
carrying its continuation). While producers keep committing, one instance at a time is
killed with SIGKILL (no checkpoint, leases left to expire) and restarted; the survivor
takes its feed ranges over after the lease TTL, from their stored continuations. Then
both drain and stop on SIGTERM. Checked as in ``test_crash.py``: nothing lost, every
message applied exactly once and in seq order by the consumer's ledgers, and every
re-publish explained by a kill that left the entry untrimmed; the duplicates per kill are
printed.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from benchmarks.rabbit import Sandbox
from benchmarks.servers import CosmosAccount
from docoutbox.errors import StoreError
from docoutbox.testing import MemoryBackend
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from tests.support.cosmos import all_items, create_container
from tests.support.processes import CliProcess
from tests.support.traffic import (
    ledger_problems,
    rabbit_traffic,
    republished,
    summary,
    unexplained_republishes,
)

pytestmark = [pytest.mark.cosmos, pytest.mark.rabbitmq, pytest.mark.slow, pytest.mark.timeout(600)]

KILLS = 6
PRODUCERS = 16
#: One heartbeat renews each held lease with its own request: on the shared local server
#: that takes long enough that a 2 s TTL (valid 1.5 s per renewal) lapses under load.
LEASE_TTL = 5.0


class Instance(CliProcess):
    """``python -m docoutbox_app dispatch`` on Cosmos DB, the key in the environment."""

    def __init__(
        self,
        account: CosmosAccount,
        database: str,
        url: str,
        exchange: str,
        *,
        lease_ttl: float = LEASE_TTL,
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            [
                "dispatch",
                *("--cosmos-endpoint", account.endpoint),
                *("--database", database, "--container", "producers"),
                *("--publisher", "rabbitmq", "--rabbitmq-url", url, "--exchange", exchange),
                *("--lease-ttl", str(lease_ttl), "--concurrency", "4", "--log-level", "INFO"),
                *extra,
            ],
            env={**os.environ, "COSMOS_KEY": account.key},
        )


def test_kill_9_one_of_two_leased_instances_loses_nothing(
    cosmos_server: CosmosAccount, cosmos_database: Any, box: Sandbox
) -> None:
    seed = int(os.environ.get("DOCOUTBOX_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\ncosmos crash test seed={seed} (DOCOUTBOX_CRASH_SEED replays it)")
    rng = random.Random(seed)
    exchange, queue, _ = box.names()
    producers, receiver = rabbit_traffic(
        box.url,
        exchange,
        queue,
        CosmosBackend(create_container(cosmos_database, "producers")),
        MemoryBackend(),
        rng,
        count=PRODUCERS,
        emits=3,
    )
    receiver.start()
    started = time.monotonic()
    producers.start(threads=2, pause=0.05)

    def launch() -> Instance:
        return Instance(cosmos_server, cosmos_database.id, box.url, exchange)

    instances = [launch(), launch()]
    pending_at_kill: list[set[str]] = []
    leases = CosmosFeedRangeLeases(
        cosmos_database.get_container_client("docoutbox_leases"),
        cosmos_database.get_container_client("producers"),
        "producers",
    )
    try:
        deadline = time.monotonic() + 6 * LEASE_TTL
        while len({o for o, _ in _leases(leases).values()}) < 2:  # the ranges are split
            assert time.monotonic() < deadline, [i.output() for i in instances]
            time.sleep(0.1)
        for kill in range(KILLS):
            before = len(receiver.deliveries)
            deadline = time.monotonic() + 20
            while len(receiver.deliveries) == before and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.2, 1.2))
            victim = kill % 2
            instances[victim].kill()
            assert instances[victim].proc.returncode == -9, instances[victim].output()
            instances[victim].close()
            pending_at_kill.append({i for ids in producers.pending().values() for i in ids})
            time.sleep(rng.uniform(0, LEASE_TTL))
            instances[victim] = launch()
    finally:
        producers.stop()
    try:
        expected = producers.expected()
        applied = receiver.wait_for(expected, timeout=120, also=lambda: not producers.pending())
        for instance in instances:
            instance.wait_started()  # the last one restarted: SIGTERM before that kills it
        codes = [instance.stop() for instance in instances]
        assert codes == [0, 0], [i.output() for i in instances]
    finally:
        for instance in instances:
            instance.close()
        receiver.stop()

    assert ledger_problems(applied, expected) == {}
    assert producers.pending() == {}
    assert all_items(cosmos_database, "docoutbox_dead_letters") == []
    assert _leases(leases) == {}  # both stopped cleanly: every lease released
    tokens = _continuations(cosmos_database)  # where each feed range resumes
    assert len(tokens) == leases.partitions and all(isinstance(t, str) for t in tokens)

    again = republished(receiver.deliveries)
    unexplained = unexplained_republishes(again, pending_at_kill)
    print(
        "cosmos crash test:",
        summary(
            {
                "seed": seed,
                "kills": len(pending_at_kill),
                "commands": producers.commands,
                "messages": sum(expected.values()),
                "deliveries": len(receiver.deliveries),
                "republished": sum(again.values()),
                "republished_per_kill": round(sum(again.values()) / len(pending_at_kill), 2),
                "max_pending_at_a_kill": max(len(p) for p in pending_at_kill),
                "seconds": round(time.monotonic() - started, 1),
            }
        ),
    )
    assert len(pending_at_kill) == KILLS
    assert unexplained == {}, "re-published more often than kills left them pending"


def _leases(table: CosmosFeedRangeLeases) -> dict[int, tuple[str, Any]]:
    try:
        return dict(table.read().leases)
    except StoreError:  # the lease container may not exist yet
        return {}


def _continuations(database: Any) -> list[Any]:
    container = database.get_container_client("docoutbox_leases")
    sql = "SELECT VALUE c.continuation FROM c WHERE c.kind = 'lease'"
    return list(container.query_items(sql, enable_cross_partition_query=True))
