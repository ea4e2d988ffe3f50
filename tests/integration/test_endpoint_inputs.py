"""An endpoint with a Kafka input on the wire server: records handled exactly once on their
aggregates (a record read twice is a duplicate), the messages they emit dispatched by the
endpoint's own dispatcher, and a clean stop."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from pymongo import MongoClient

from benchmarks.ledger import make_entry
from benchmarks.servers import Topics
from docoutbox import Aggregate, Decision, Handlers, InboxPolicy, Message, StoreConfig, emit
from docoutbox.model import OutboxMessage
from docoutbox.testing import MemoryPublisher
from docoutbox_app.endpoint import Endpoint, KafkaTopic, Store, payload_field, serve
from docoutbox_kafka import KafkaPublisher

pytestmark = [pytest.mark.kafka, pytest.mark.wire]

RECORDS = 12


class Tally(Aggregate):
    seen: int = 0


tally: Handlers[Tally] = Handlers()


@tally.on("Count")
def count(state: Tally, message: Message) -> Decision[Tally]:
    return Decision(Tally(seen=state.seen + 1), emit("Counted", {"n": state.seen + 1}))


def entries() -> list[OutboxMessage]:
    made = []
    for n in range(RECORDS):
        entry = make_entry("producer", n + 1, type="Count")
        made.append(entry.model_copy(update={"payload": {"tally": f"t-{n % 3}"}}))
    return made


def test_a_kafka_input(kafka: str, topics: Topics, mongo_uri: str) -> None:
    topic = topics.create(partitions=2)
    records = entries()
    with KafkaPublisher(kafka, topic) as publisher:
        for entry in [*records, *records[:4]]:  # four records read twice
            publisher.publish(entry)
    published = MemoryPublisher()
    database = f"endpoint_kafka_{uuid.uuid4().hex[:8]}"
    endpoint: Endpoint[Any] = Endpoint(
        "tallies",
        Tally,
        tally,
        store=Store("mongo", mongo_uri, database, "tallies"),
        inputs=[
            KafkaTopic(
                topics=[topic],
                group=f"g-{uuid.uuid4().hex[:8]}",
                config=kafka,
                route=payload_field("tally"),
                creates={"Count"},
            )
        ],
        output=published,
        config=StoreConfig(inbox=InboxPolicy(window=0, exact=True)),
    )

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(serve([endpoint], stop))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(published.published) < RECORDS:
            await asyncio.sleep(0.1)
        stop.set()
        await running

    try:
        asyncio.run(scenario())
        assert sorted(e.payload["n"] for e in published.published) == sorted(
            n for t in range(3) for n in range(1, RECORDS // 3 + 1)
        )

        with MongoClient(mongo_uri) as client:
            docs = list(client[database]["tallies"].find())
            assert sorted(d["state"]["seen"] for d in docs) == [RECORDS // 3] * 3
            assert all(d["outbox"] == [] for d in docs)
    finally:
        with MongoClient(mongo_uri) as client:
            client.drop_database(database)
