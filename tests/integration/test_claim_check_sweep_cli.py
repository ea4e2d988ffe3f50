"""``docoutbox outbox sweep-payloads``: the claim check's orphan sweep from the command line,
on the wire server and on the local Cosmos DB server; it keeps the payloads of pending
entries and of dead letters."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, StoreConfig
from docoutbox.ports.payloads import PayloadInfo
from docoutbox.store.document import utcnow
from docoutbox.stored.claim import ClaimCheck
from docoutbox_app.cli import main
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.clients import coordination_container
from docoutbox_cosmos.coordination import CosmosDeadLetters
from docoutbox_cosmos.payloads import CosmosPayloads, create_payloads_container
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.coordination import MongoDeadLetters
from docoutbox_mongo.payloads import MongoPayloads
from tests.support.cosmos import create_container
from tests.unit.test_claim_check import BIG, Box, emit, message


def planted(backend: Any, payloads: Any, dead_letters: Any) -> None:
    """An old payload of a pending entry, an old one of a dead letter, an old orphan and
    a young one."""
    old = utcnow() - timedelta(hours=2)
    claim = ClaimCheck(payloads, threshold=1000)
    store = AggregateStore(backend, Box, StoreConfig(claim_check=claim, clock=lambda: old))
    store.handle("a", message(1), emit(BIG), create=True)  # old, and referenced
    payloads.put(PayloadInfo("orphan-old", "a", "gone", 3, old, "g"), b"abc")
    payloads.put(PayloadInfo("orphan-young", "a", "gone", 3, utcnow(), "g"), b"abc")
    payloads.put(PayloadInfo("dead-old", "a", "dead", 3, old, "g"), b"abc")
    entry = {"id": "dead", "type": "T", "seq": 9, "aggregate_id": "a", "aggregate_type": "Box"}
    entry["claim"] = {"id": "dead-old", "size": 3, "encoded": False}
    dead_letters.put("a", entry, "refused", 1)


def sweep(capsys: pytest.CaptureFixture[str], *where: str) -> dict[str, int]:
    capsys.readouterr()
    code = main(["outbox", "sweep-payloads", *where, "--grace", "3600", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    result: dict[str, int] = json.loads(out)
    return result


@pytest.mark.wire
def test_the_sweep_command_on_mongodb(
    mongo: Any, mongo_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = MongoPayloads(mongo["boxes_payloads"])
    letters = MongoDeadLetters(mongo["docoutbox_dead_letters"])
    planted(MongoBackend(mongo["boxes"]), payloads, letters)
    where = ("--mongo-uri", mongo_uri, "--db", mongo.name, "--collection", "boxes")
    assert sweep(capsys, *where) == {"deleted": 1, "referenced": 2, "refreshed": 0}
    ids = {doc["_id"] for doc in mongo["boxes_payloads"].find({"kind": "manifest"})}
    assert "orphan-old" not in ids and {"orphan-young", "dead-old"} <= ids and len(ids) == 3


@pytest.mark.cosmos
def test_the_sweep_command_on_cosmos_db(
    cosmos_server: CosmosAccount, cosmos_database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    boxes = create_container(cosmos_database, "boxes")
    payloads = CosmosPayloads(create_payloads_container(cosmos_database, "boxes_payloads"))
    letters = CosmosDeadLetters(coordination_container(cosmos_database, "docoutbox_dead_letters"))
    planted(CosmosBackend(boxes), payloads, letters)
    where = [
        "--cosmos-endpoint",
        cosmos_server.endpoint,
        "--cosmos-key",
        cosmos_server.key,
        "--db",
        cosmos_database.id,
        "--collection",
        "boxes",
    ]
    if cosmos_server.client_kwargs.get("connection_verify") is False:
        where.append("--cosmos-insecure")
    assert sweep(capsys, *where) == {"deleted": 1, "referenced": 2, "refreshed": 0}
    left = {i.payload_id for i in payloads.stale(utcnow() + timedelta(days=1), 10)}
    assert "orphan-old" not in left and {"orphan-young", "dead-old"} <= left and len(left) == 3
