"""Producers on Cosmos DB → ``docoutbox dispatch --async`` (azure.cosmos.aio) → RabbitMQ →
consumer inbox, exactly once, across a SIGTERM.

The command runs as users run it, in a subprocess. It is stopped with SIGTERM while
producers are still committing: it must drain (finish in-flight runs: publish and trim),
and exit 0, leaving every entry either delivered and trimmed or still pending, never
trimmed undelivered. A second ``--async`` run (change feed plus sweep) publishes the rest;
every ledger then holds 1..N exactly once, in order.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from benchmarks.rabbit import Sandbox
from benchmarks.servers import CosmosAccount
from docoutbox_cosmos import CosmosBackend
from tests.support.cosmos import all_items, create_container
from tests.support.processes import CliProcess
from tests.support.traffic import ledger_problems, rabbit_traffic

pytestmark = [pytest.mark.cosmos, pytest.mark.rabbitmq]

PRODUCERS = 8
EMITS = 2


def _dispatch(account: CosmosAccount, database: str, url: str, exchange: str) -> CliProcess:
    env = {**os.environ, "COSMOS_KEY": account.key, "DOCOUTBOX_RABBITMQ_URL": url}
    return CliProcess(
        [
            "dispatch", "--async",
            "--cosmos-endpoint", account.endpoint, "--database", database,
            "--container", "producers", "--publisher", "rabbitmq", "--exchange", exchange,
            "--name", "e2e-async", "--lease-ttl", "5", "--concurrency", "4",
            "--sweep-interval", "2", "--grace", "1",
        ],
        env,
        pipes=True,
    )  # fmt: skip


def _stop(proc: CliProcess) -> str:
    _, err = proc.terminate()
    assert proc.returncode == 0, err
    assert "dispatcher_stopped name=e2e-async" in err, err
    return str(err)


def _pending_seqs(container: Any) -> dict[str, list[int]]:
    rows = container.query_items("SELECT c.aid, c.outbox FROM c", enable_cross_partition_query=True)
    return {f"Counter/{r['aid']}": sorted(e["seq"] for e in r["outbox"] or []) for r in rows}


def test_async_dispatch_is_exactly_once_across_a_sigterm(
    cosmos_server: CosmosAccount, cosmos_database: Any, box: Sandbox
) -> None:
    exchange, queue, _ = box.names()
    container = create_container(cosmos_database, "producers")
    producers, receiver = rabbit_traffic(
        box.url,
        exchange,
        queue,
        CosmosBackend(container),
        CosmosBackend(create_container(cosmos_database, "ledgers")),
        random.Random(7),
        count=PRODUCERS,
        emits=EMITS,
    )
    producers.run_commands(2)  # pending before the start: found by the sweep
    receiver.start()
    proc = _dispatch(cosmos_server, cosmos_database.id, box.url, exchange)
    try:
        producers.start(threads=2, pause=0.02)  # committed while it follows the feed
        deadline = time.monotonic() + 60
        while sum(len(s) for s in receiver.applied(sorted(producers.expected())).values()) < 30:
            assert time.monotonic() < deadline, "nothing consumed"
            assert proc.proc.poll() is None, proc.communicate()[1]
            time.sleep(0.1)
        first = _stop(proc)  # SIGTERM while producers still commit
        producers.stop()

        # Drained: every entry is either delivered (and trimmed) or still pending.
        expected = producers.expected()
        applied, count = {}, -1
        while True:  # until the consumer has taken everything that was published
            assert time.monotonic() < deadline + 60, "the queue does not drain"
            applied = receiver.applied(sorted(expected))
            now = sum(len(seqs) for seqs in applied.values())
            if now == count and not box.depth(queue):
                break
            count = now
            time.sleep(0.5)
        pending = _pending_seqs(container)
        for source, last in expected.items():
            delivered, left = applied[source], pending.get(source, [])
            assert delivered == sorted(delivered), (source, delivered)
            assert sorted(delivered + left) == list(range(1, last + 1)), (source, delivered, left)
        assert any(pending.values()), "SIGTERM came too late to leave work for the restart"

        second = _dispatch(cosmos_server, cosmos_database.id, box.url, exchange)  # resumes
        applied = receiver.wait_for(expected, timeout=90)
        _stop(second)
    finally:
        proc.close()
        receiver.stop()

    assert ledger_problems(applied, expected) == {}
    assert not any(_pending_seqs(container).values())
    assert sum(expected.values()) == producers.commands * EMITS
    assert all_items(cosmos_database, "docoutbox_dead_letters") == []
    assert "async=True" in first
    assert cosmos_server.key not in first
