"""Producers on Cosmos DB → outbox → dispatcher (change feed) → RabbitMQ → consumer inbox.

The same pipeline as ``test_end_to_end.py``, with every aggregate (producers and the
consumer's ledgers) in Cosmos DB containers, and the dispatcher wired by
:func:`docoutbox_cosmos.open_kit` as the CLI wires it.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from benchmarks.rabbit import Sandbox
from benchmarks.servers import CosmosAccount
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox_cosmos import CosmosBackend, open_kit
from docoutbox_rabbitmq import RabbitPublisher
from tests.support.cosmos import all_items, create_container
from tests.support.traffic import (
    ledger_problems,
    rabbit_traffic,
    republished,
    summary,
)

pytestmark = [pytest.mark.cosmos, pytest.mark.rabbitmq]

PRODUCERS = 12
COMMANDS = 6
EMITS = 3


def test_every_message_is_processed_exactly_once_in_order(
    cosmos_server: CosmosAccount, cosmos_database: Any, box: Sandbox
) -> None:
    exchange, queue, _ = box.names()
    producers, receiver = rabbit_traffic(
        box.url,
        exchange,
        queue,
        CosmosBackend(create_container(cosmos_database, "producers")),
        CosmosBackend(create_container(cosmos_database, "ledgers")),
        random.Random(1),
        count=PRODUCERS,
        emits=EMITS,
    )
    target = open_kit(
        cosmos_server.endpoint,
        cosmos_server.key,
        cosmos_database.id,
        "producers",
        client_options=cosmos_server.client_kwargs,
    )
    publisher = RabbitPublisher(box.url, exchange)
    dispatcher = Dispatcher(
        target.backend,
        publisher,
        target.dead_letters,
        source=target.source,
        checkpoints=target.checkpoints,
        config=DispatcherConfig(name="e2e", concurrency=4, policy=DispatchPolicy()),
    )
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    started = time.monotonic()
    try:
        producers.run_commands(COMMANDS // 2)  # pending before the start: the sweep
        receiver.start()
        thread.start()
        assert dispatcher.started.wait(30)
        producers.run_commands(COMMANDS // 2)  # committed while it follows the change feed
        expected = producers.expected()
        applied = receiver.wait_for(expected, timeout=90, also=lambda: not producers.pending())
    finally:
        dispatcher.stop()
        thread.join(timeout=30)
        publisher.close()
        target.close()
        receiver.stop()

    assert sum(expected.values()) == PRODUCERS * COMMANDS * EMITS
    assert ledger_problems(applied, expected) == {}
    assert producers.pending() == {}
    assert all_items(cosmos_database, "docoutbox_dead_letters") == []
    firsts: dict[str, list[int]] = {}
    for delivery in receiver.deliveries:
        if not delivery.duplicate and delivery.source and delivery.seq is not None:
            firsts.setdefault(delivery.source, []).append(delivery.seq)
    assert firsts == applied  # first deliveries per source in seq order
    assert all(d.action == "ack" for d in receiver.deliveries)
    again = republished(receiver.deliveries)
    print(
        "\ncosmos end-to-end:",
        summary(
            {
                "messages": sum(expected.values()),
                "deliveries": len(receiver.deliveries),
                "republished": sum(again.values()),
                "seconds": round(time.monotonic() - started, 2),
            }
        ),
    )
    assert again == {}
