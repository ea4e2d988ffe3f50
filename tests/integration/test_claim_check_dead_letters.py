"""A claim-checked entry the broker refuses for good, on the wire server: its payload (17 MB)
is over MongoDB's 16 MB document limit, so a dead letter holding it could never be
written. The dead letter holds the reference, the outbox is trimmed, the payload stays
(the orphan sweep keeps it too), and a replay publishes the whole payload, after which
the payload is deleted."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox import AggregateStore, StoreConfig
from docoutbox.errors import PermanentPublishError
from docoutbox.model import OutboxMessage
from docoutbox.store.document import utcnow
from docoutbox.stored.claim import ClaimCheck
from docoutbox.stored.sweep import sweep_orphans
from docoutbox_app.wiring import DispatchOptions, build_dispatcher
from docoutbox_mongo import open_kit
from docoutbox_mongo.admin import DeadLetterAdmin
from tests.integration.test_claim_check_e2e import LIMIT, MB, Uploader, blob, upload
from tests.support.cosmos import unique

SIZE = 17 * MB


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


@pytest.mark.wire
def test_a_17_mb_payload_refused_for_good_is_dead_lettered_by_reference_and_replayed(
    mongo_uri: str,
) -> None:
    name = unique("deadclaim")
    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    kit = open_kit(mongo_uri, name, "uploads")
    try:
        db = client[name]
        letters = kit.dead_letters.collection
        claim = ClaimCheck(kit.payloads, threshold=LIMIT)
        store = AggregateStore(kit.backend, Uploader, StoreConfig(claim_check=claim))
        command = {"id": "upload-1", "type": "Upload", "payload": {"size": SIZE}}
        assert store.handle("uploader-1", command, upload, create=True).applied
        expected = hashlib.sha256(blob(SIZE, "upload-1").encode()).hexdigest()

        def pending() -> list[Any]:
            return list(db["uploads"].find_one({"_id": "uploader-1"})["outbox"])

        def payloads() -> int:
            return int(db["uploads_payloads"].count_documents({}))

        refusing = Refusing()
        dispatch_until(
            kit,
            refusing,
            lambda: letters.count_documents({}) == 1 and not pending(),
            "the dead letter written and the outbox trimmed",
        )
        (letter,) = letters.find({})
        assert "payload" not in letter["entry"] and letter["entry"]["claim"]["size"] > 16 * MB
        assert payloads() > 0  # the payload stays for the dead letter

        later = utcnow() + timedelta(days=1)  # every payload is stale by then
        report = sweep_orphans(
            kit.backend, kit.payloads, 60.0, dead_letters=kit.dead_letters, now=later
        )
        assert report.referenced == [letter["entry"]["claim"]["id"]] and not report.deleted

        [done] = DeadLetterAdmin(letters, db["uploads"]).replay([letter["_id"]])
        assert done.action == "re-appended" and letters.count_documents({}) == 0
        taking = Taking()
        dispatch_until(
            kit,
            taking,
            lambda: bool(taking.digests) and not pending() and payloads() == 0,
            "the replayed entry published whole, trimmed, and its payload deleted",
        )
        assert taking.digests == [expected]
    finally:
        kit.close()
        client.drop_database(name)
        client.close()
