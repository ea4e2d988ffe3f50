"""Producers → outbox → dispatcher (change stream) → RabbitMQ → consumer inbox, end to end.

Twenty producer aggregates commit commands on the wire server, each emitting three
messages. The real dispatcher engine follows the collection's change stream and publishes
through :class:`~docoutbox_rabbitmq.RabbitPublisher` to one queue; a
:class:`~docoutbox_rabbitmq.RabbitConsumer` applies them to ledgers, one per producer,
with exact de-duplication. Each ledger records the seqs it applied, in order.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from docoutbox import AggregateStore
from docoutbox.dispatch import DispatchPolicy
from docoutbox.dispatcher import Dispatcher, DispatcherConfig
from docoutbox.testing.contract import Counter
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.wiring import connect_dispatch
from docoutbox_rabbitmq import RabbitPublisher
from tests.support.e2e import Ledger, Sandbox, require_rabbitmq, sandbox
from tests.support.traffic import (
    RECEIVER_CONFIG,
    Producers,
    Receiver,
    ledger_problems,
    republished,
    summary,
)

pytestmark = [pytest.mark.wire, pytest.mark.rabbitmq]

PRODUCERS = 20
COMMANDS = 10  # per producer, before and again after the dispatcher starts
EMITS = 3


@pytest.fixture
def box() -> Iterator[Sandbox]:
    with sandbox(require_rabbitmq()) as created:
        yield created


@pytest.fixture
def mongo(mongo_uri: str) -> Iterator[Any]:
    from pymongo import MongoClient

    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    name = f"e2e_{uuid.uuid4().hex[:8]}"
    yield client[name]
    client.drop_database(name)
    client.close()


def test_every_message_is_processed_exactly_once_in_order(
    mongo_uri: str, mongo: Any, box: Sandbox
) -> None:
    exchange, queue, _ = box.names()
    with RabbitPublisher(box.url, exchange) as setup:
        setup.declare(queues={queue: ["#"]})
    producers = Producers(
        AggregateStore(MongoBackend(mongo["producers"]), Counter),
        [f"p{i:02d}" for i in range(PRODUCERS)],
        random.Random(1),
        emits=EMITS,
    )
    receiver = Receiver(
        box.url, queue, AggregateStore(MongoBackend(mongo["ledgers"]), Ledger, RECEIVER_CONFIG)
    )
    receiver.start()
    producers.run_commands(COMMANDS // 2)  # pending before the dispatcher starts: the sweep

    target = connect_dispatch(mongo_uri, mongo.name, "producers")
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
    thread.start()
    try:
        assert dispatcher.started.wait(30)
        producers.run_commands(COMMANDS // 2)  # committed while it follows the stream
        expected = producers.expected()
        applied = receiver.wait_for(expected, timeout=90, also=lambda: not producers.pending())
    finally:
        dispatcher.stop()
        thread.join(timeout=30)
        publisher.close()
        target.close()
        receiver.stop()
    elapsed = time.monotonic() - started

    total = PRODUCERS * COMMANDS * EMITS
    assert sum(expected.values()) == total and len(expected) == PRODUCERS
    # Exactly once, none lost, in seq order: each ledger applied exactly 1..N, in order.
    assert ledger_problems(applied, expected) == {}
    assert producers.pending() == {}  # everything published was trimmed
    assert mongo["docoutbox_dead_letters"].count_documents({}) == 0
    # Delivery order on the one queue: per source, first deliveries come in seq order.
    firsts: dict[str, list[int]] = {}
    for delivery in receiver.deliveries:
        if not delivery.duplicate and delivery.source is not None and delivery.seq is not None:
            firsts.setdefault(delivery.source, []).append(delivery.seq)
    assert firsts == applied
    again = republished(receiver.deliveries)
    assert all(d.action == "ack" for d in receiver.deliveries)
    print(
        "\nend-to-end:",
        summary(
            {
                "producers": PRODUCERS,
                "commands": producers.commands,
                "messages": total,
                "deliveries": len(receiver.deliveries),
                "republished": sum(again.values()),
                "seconds": round(elapsed, 2),
            }
        ),
    )
    assert again == {}  # without crashes, nothing is published twice
