"""Large payloads end to end with the claim check: a 20 MB payload on MongoDB (the wire
server) and a 5 MB payload on Cosmos DB (the local server).

A producer aggregate emits the payload; a leased dispatcher built by the application's
wiring (``DispatchOptions(claim_check=True)``) resolves it from the kit's payload store
and publishes it through RabbitMQ; a consumer aggregate handles it with de-duplication,
and a redelivery of the same message (nacked before its ack, as after a crash) is
recognised as a duplicate. Exactly once: the consumer holds the payload's digest once,
the producer's outbox is empty and the payload store too (deleted after the trim). The
raw documents, as the database holds them, stay under 64 KB throughout.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bson
import pika
import pytest
from pydantic import Field
from pymongo import MongoClient

from benchmarks.rabbit import Sandbox
from benchmarks.servers import CosmosAccount
from docoutbox import Aggregate, AggregateStore, Decision, Message, StoreConfig, emit
from docoutbox.ports.payloads import PayloadKit
from docoutbox.stored.claim import ClaimCheck
from docoutbox_app.wiring import DispatchOptions, build_dispatcher
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos import open_kit as open_cosmos_kit
from docoutbox_mongo import MongoBackend
from docoutbox_mongo import open_kit as open_mongo_kit
from docoutbox_rabbitmq import RabbitPublisher
from docoutbox_rabbitmq.consumer import RabbitConsumer
from tests.support.cosmos import all_items, create_container, unique

LIMIT = 64 * 1024
MB = 1024 * 1024


class Uploader(Aggregate):
    sent: int = 0


class Archive(Aggregate):
    digests: list[str] = Field(default_factory=list)


def blob(size: int, seed: str) -> str:
    """``size`` characters of base64 text that does not compress."""
    raw = random.Random(seed).randbytes(size * 3 // 4)
    return base64.b64encode(raw).decode("ascii")[:size]


def upload(state: Uploader, message: Message) -> Decision[Uploader]:
    size = int(str(message.payload["size"]))
    data = blob(size, message.id)
    return Decision(Uploader(sent=state.sent + 1), emit("Uploaded", {"data": data}))


def archive(state: Archive, message: Message) -> Archive:
    digest = hashlib.sha256(str(message.payload["data"]).encode()).hexdigest()
    return Archive(digests=[*state.digests, digest])


@dataclass
class Database:
    """One database's side of the test: raw reads of what is stored."""

    kit: Any
    consumers: Any
    producer_doc: Callable[[], int]
    consumer_doc: Callable[[], int]
    payload_count: Callable[[], int]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def run_through(db: Database, box: Sandbox, size: int) -> None:
    exchange, queue, _ = box.names()
    with RabbitPublisher(box.url, exchange) as setup:
        setup.declare(queues={queue: ["#"]})
    kit = db.kit
    assert isinstance(kit, PayloadKit)
    producers = AggregateStore(
        kit.backend, Uploader, StoreConfig(claim_check=ClaimCheck(kit.payloads, threshold=LIMIT))
    )
    command = {"id": "upload-1", "type": "Upload", "payload": {"size": size}}
    outcome = producers.handle("uploader-1", command, upload, create=True)
    expected = hashlib.sha256(blob(size, "upload-1").encode()).hexdigest()
    assert outcome.applied and db.payload_count() >= 1
    before = db.producer_doc()
    assert before < LIMIT  # the entry holds a reference, not the payload

    publisher = RabbitPublisher(box.url, exchange)
    options = DispatchOptions(
        name=unique("claim"), leases=True, lease_ttl=3.0, claim_check=True, concurrency=2
    )
    dispatcher = build_dispatcher(kit, publisher, options)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: box.depth(queue) == 1, 120, "the message on the queue")
        wait_until(lambda: db.payload_count() == 0, 60, "the payload deleted after the trim")
    finally:
        dispatcher.stop()
        thread.join(timeout=30)
        publisher.close()
    assert kit.backend.load("uploader-1")["outbox"] == []

    consumer = RabbitConsumer(
        box.url, queue, db.consumers, archive, aggregate_id_of=lambda m: "archive-1", create=True
    )
    connection = pika.BlockingConnection(pika.URLParameters(box.url))
    try:
        channel = connection.channel()
        seen = []
        for settle in ("nack", "ack"):  # handled, crashed before the ack; then again
            method, props, body = channel.basic_get(queue, auto_ack=False)
            assert method is not None and len(body) > size
            verdict = consumer.decide(body, props.headers, props.content_type)
            assert verdict.outcome is not None
            seen.append((method.redelivered, verdict.outcome.status.value))
            if settle == "nack":
                channel.basic_nack(method.delivery_tag, requeue=True)
            else:
                channel.basic_ack(method.delivery_tag)
        assert seen == [(False, "applied"), (True, "duplicate")]
        assert channel.basic_get(queue, auto_ack=True)[0] is None
    finally:
        connection.close()
    assert db.consumers.get("archive-1").state.digests == [expected]  # exactly once
    assert db.consumer_doc() < LIMIT and db.producer_doc() < LIMIT
    print(
        f"\nclaim check end to end: payload {size / MB:.0f} MB, producer document "
        f"{before} B pending, {db.producer_doc()} B after, consumer document "
        f"{db.consumer_doc()} B"
    )


@pytest.mark.wire
@pytest.mark.rabbitmq
def test_a_20_mb_payload_on_mongodb_goes_through_exactly_once(mongo_uri: str, box: Sandbox) -> None:
    name = unique("claim_e2e")
    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    kit = open_mongo_kit(mongo_uri, name, "uploads")
    try:
        db = client[name]

        def size_of(collection: str, key: str) -> int:
            doc = db[collection].find_one({"_id": key})
            assert doc is not None
            return len(bson.encode(doc))

        database = Database(
            kit,
            AggregateStore(MongoBackend(db["archives"]), Archive),
            lambda: size_of("uploads", "uploader-1"),
            lambda: size_of("archives", "archive-1"),
            lambda: db["uploads_payloads"].count_documents({}),
        )
        run_through(database, box, 20 * MB)
    finally:
        kit.close()
        client.drop_database(name)
        client.close()


@pytest.mark.cosmos
@pytest.mark.rabbitmq
def test_a_5_mb_payload_on_cosmos_db_goes_through_exactly_once(
    cosmos_server: CosmosAccount, cosmos_database: Any, box: Sandbox
) -> None:
    uploads = create_container(cosmos_database, "uploads")
    archives = create_container(cosmos_database, "archives")
    kit = open_cosmos_kit(
        cosmos_server.endpoint,
        cosmos_server.key,
        cosmos_database.id,
        "uploads",
        client_options=cosmos_server.client_kwargs,
    )
    try:

        def size_of(container: Any, key: str) -> int:
            item = container.read_item(key, partition_key=key)
            return len(json.dumps(item, separators=(",", ":")).encode())

        database = Database(
            kit,
            AggregateStore(CosmosBackend(archives), Archive),
            lambda: size_of(uploads, "uploader-1"),
            lambda: size_of(archives, "archive-1"),
            lambda: len(all_items(cosmos_database, "uploads_payloads")),
        )
        run_through(database, box, 5 * MB)
    finally:
        kit.close()
