"""A claim-checked entry the broker refuses for good: its payload is over the database's
limit (17 MB on the wire server, over MongoDB's 16 MB; 3 MB on the local Cosmos DB
server, over its 2 MB), so a dead letter holding it could never be written. The dead
letter holds the reference, the outbox is trimmed, the payload stays (the orphan sweep
keeps it too), and a replay publishes the whole payload, after which the payload is
deleted."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, StoreConfig
from docoutbox.errors import PermanentPublishError
from docoutbox.model import OutboxMessage
from docoutbox.store.document import utcnow
from docoutbox.stored.claim import ClaimCheck
from docoutbox.stored.sweep import sweep_orphans
from docoutbox_app.wiring import DispatchOptions, build_dispatcher
from docoutbox_cosmos import open_kit as open_cosmos_kit
from docoutbox_cosmos.admin import DeadLetterAdmin as CosmosDeadLetterAdmin
from docoutbox_mongo import open_kit as open_mongo_kit
from docoutbox_mongo.admin import DeadLetterAdmin as MongoDeadLetterAdmin
from tests.integration.test_claim_check_e2e import LIMIT, MB, Uploader, blob, upload
from tests.support.cosmos import all_items, create_container, unique


class Refusing:
    """A broker that refuses every entry for good."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def publish(self, entry: OutboxMessage) -> None:
        self.refused.append(entry.id)
        raise PermanentPublishError("refused: no such route")


class Taking:
    """A broker that takes every entry; keeps the digest of each payload's data."""

    def __init__(self) -> None:
        self.digests: list[str] = []

    def publish(self, entry: OutboxMessage) -> None:
        self.digests.append(hashlib.sha256(str(entry.payload["data"]).encode()).hexdigest())


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def dispatch_until(kit: Any, publisher: Any, done: Callable[[], bool], what: str) -> None:
    options = DispatchOptions(name=unique("deadclaim"), leases=False, claim_check=True)
    dispatcher = build_dispatcher(kit, publisher, options)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    try:
        wait_until(done, what)
    finally:
        dispatcher.stop()
        thread.join(timeout=30)


@dataclass
class Database:
    """One database's side: its kit, an admin of its dead letters, raw reads."""

    kit: Any
    admin: Any
    dead_letters: Callable[[], list[dict[str, Any]]]
    pending: Callable[[], list[Any]]
    payloads: Callable[[], int]


def refused_then_replayed(db: Database, size: int) -> None:
    kit = db.kit
    claim = ClaimCheck(kit.payloads, threshold=LIMIT)
    store = AggregateStore(kit.backend, Uploader, StoreConfig(claim_check=claim))
    command = {"id": "upload-1", "type": "Upload", "payload": {"size": size}}
    assert store.handle("uploader-1", command, upload, create=True).applied
    expected = hashlib.sha256(blob(size, "upload-1").encode()).hexdigest()

    dispatch_until(
        kit,
        Refusing(),
        lambda: len(db.dead_letters()) == 1 and not db.pending(),
        "the dead letter written and the outbox trimmed",
    )
    (letter,) = db.dead_letters()
    entry = letter["entry"]
    assert "payload" not in entry and entry["claim"]["size"] > size
    assert db.payloads() > 0  # the payload stays for the dead letter

    later = utcnow() + timedelta(days=1)  # every payload is stale by then
    report = sweep_orphans(
        kit.backend, kit.payloads, 60.0, dead_letters=kit.dead_letters, now=later
    )
    assert report.referenced == [entry["claim"]["id"]] and not report.deleted

    [done] = db.admin.replay([letter["_id"]])
    assert done.action == "re-appended" and db.dead_letters() == []
    taking = Taking()
    dispatch_until(
        kit,
        taking,
        lambda: bool(taking.digests) and not db.pending() and db.payloads() == 0,
        "the replayed entry published whole, trimmed, and its payload deleted",
    )
    assert taking.digests == [expected]


@pytest.mark.wire
def test_a_17_mb_payload_on_mongodb_is_dead_lettered_by_reference_and_replayed(
    mongo_uri: str,
) -> None:
    name = unique("deadclaim")
    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    kit = open_mongo_kit(mongo_uri, name, "uploads")
    try:
        raw = client[name]
        letters = kit.dead_letters.collection
        db = Database(
            kit,
            MongoDeadLetterAdmin(letters, raw["uploads"]),
            lambda: list(letters.find({})),
            lambda: list(raw["uploads"].find_one({"_id": "uploader-1"})["outbox"]),
            lambda: int(raw["uploads_payloads"].count_documents({})),
        )
        refused_then_replayed(db, 17 * MB)
    finally:
        kit.close()
        client.drop_database(name)
        client.close()


@pytest.mark.cosmos
def test_a_3_mb_payload_on_cosmos_db_is_dead_lettered_by_reference_and_replayed(
    cosmos_server: CosmosAccount, cosmos_database: Any
) -> None:
    uploads = create_container(cosmos_database, "uploads")
    kit = open_cosmos_kit(
        cosmos_server.endpoint,
        cosmos_server.key,
        cosmos_database.id,
        "uploads",
        client_options=cosmos_server.client_kwargs,
    )
    try:
        letters = kit.dead_letters.container
        admin = CosmosDeadLetterAdmin(letters, uploads)
        db = Database(
            kit,
            admin,
            lambda: admin.listing(0),
            lambda: list(uploads.read_item("uploader-1", partition_key="uploader-1")["outbox"]),
            lambda: len(all_items(cosmos_database, "uploads_payloads")),
        )
        refused_then_replayed(db, 3 * MB)
    finally:
        kit.close()
