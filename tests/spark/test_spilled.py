"""The audit reads a spilling consumer's archive: a message whose ID left the window for
the archive is reconciled by ID, never reported unverifiable or lost."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.cosmos import CosmosClient, PartitionKey
from pymongo import MongoClient

from docoutbox import AggregateStore, InboxPolicy, StoreConfig
from docoutbox.store.plans import entry_id
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_app.cli import main
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.archive import archive_name, ensure_archive
from docoutbox_mongo import MongoBackend
from docoutbox_spark import audit
from docoutbox_spark.conform import conform
from docoutbox_spark.readers import CosmosTarget, read_cosmos
from docoutbox_spark.run import run_audit
from docoutbox_spark.schema import RAW_ARCHIVE_SCHEMA
from docoutbox_spark.spilled import read_cosmos_archive, with_spilled
from tests.spark import planted
from tests.spark.test_audit import config, frame
from tests.spark.test_cosmos import _account, item

#: Producer ``Wallet/a`` emitted seqs 1..5; its consumer keeps a window of 2.
EMITTED = 5


def _ids(seqs: range) -> list[str]:
    return [entry_id("Wallet", "a", seq) for seq in seqs]


def _archive(ids: list[str]) -> list[dict[str, Any]]:
    return [{"_id": f"x{n}", "aggregate_id": "c-a", "message_id": i} for n, i in enumerate(ids)]


def test_spilled_ids_count_as_held_in_the_window(spark: Any) -> None:
    producers = frame(spark, [planted.doc("a", EMITTED, [], 0)])
    window = _ids(range(4, EMITTED + 1))
    consumer = planted.doc("c-a", 0, [], 0, type="Statement", inbox=window)
    consumers = frame(spark, [consumer])
    archive = frame(spark, _archive(_ids(range(1, 4))), RAW_ARCHIVE_SCHEMA)

    without = run_audit(producers, consumer=consumers, config=config())
    assert without["reconciliation"]["unverifiable"] == 3
    summary = run_audit(producers, consumer=consumers, consumer_archive=archive, config=config())
    assert summary["reconciliation"]["unverifiable"] == 0
    assert summary["reconciliation"]["by_id_window"] == EMITTED
    assert summary["failed"] == []

    docs = conform(consumers).documents
    issues = audit.reconcile(conform(producers).documents, with_spilled(docs, archive))
    assert issues.count() == 0
    merged = with_spilled(docs, archive).collect()[0]
    assert sorted(merged.inbox) == sorted(_ids(range(1, EMITTED + 1)))
    assert with_spilled(docs, archive).columns == docs.columns


@pytest.fixture
def spilled_db(wire_server: Any) -> Iterator[tuple[str, str]]:
    """A producer collection whose ``Wallet/a`` emitted 12 messages, and a consumer that
    handled them all through a spilling window of 4 (most IDs are in its archive)."""
    client: Any = MongoClient(wire_server.uri, uuidRepresentation="standard")
    name = f"spill_{uuid.uuid4().hex[:8]}"
    db = client[name]
    try:
        db.producer.insert_one(planted.doc("a", 12, [], 0))
        store = AggregateStore(
            MongoBackend(db.consumer), Counter, StoreConfig(inbox=InboxPolicy(window=4, spill=True))
        )
        for message_id in _ids(range(1, 13)):
            assert store.handle("c-a", add_msg(message_id), counter_handlers, create=True).applied
        assert db["consumer.inbox"].count_documents({}) >= 8
        yield wire_server.uri, name
    finally:
        client.drop_database(name)
        client.close()


def test_the_cli_reads_the_archive_of_a_spilling_consumer(
    spark: Any, spilled_db: tuple[str, str], tmp_path: Path
) -> None:
    uri, db = spilled_db
    common = [
        "--mongo-uri",
        uri,
        "--db",
        db,
        "--collection",
        "producer",
        "--consumer-collection",
        "consumer",
        "--reader",
        "datasource",
        "--now",
        planted.NOW.isoformat(),
        "--progress-interval",
        "0",
    ]

    def audited(*extra: str) -> dict[str, Any]:
        out = tmp_path / f"audit{len(extra)}.json"
        main(["audit", *common, *extra, "--json", str(out)])
        summary: dict[str, Any] = json.loads(out.read_text())
        return summary

    assert audited()["reconciliation"]["unverifiable"] >= 8
    spilled = audited("--spilled")["reconciliation"]
    assert spilled["unverifiable"] == 0 and spilled["lost"] == 0
    assert spilled["by_id_window"] == 12

    snap = tmp_path / "snapshot"
    export = [a for a in common if a not in ("--now", planted.NOW.isoformat())]
    assert main(["export", *export, "--spilled", "--out", str(snap)]) == 0
    assert (snap / "consumer_archive").is_dir()
    out = tmp_path / "parquet.json"
    main(
        [
            "audit",
            "--from-parquet",
            str(snap),
            "--now",
            planted.NOW.isoformat(),
            "--json",
            str(out),
            "--progress-interval",
            "0",
        ]
    )
    assert json.loads(out.read_text())["reconciliation"]["unverifiable"] == 0


def test_the_cosmos_reader_reads_the_archive_of_a_spilling_consumer(
    spark: Any, request: pytest.FixtureRequest
) -> None:
    endpoint, key, kwargs = _account(request)
    client = CosmosClient(endpoint, key, **kwargs)
    name = f"spill_{uuid.uuid4().hex[:8]}"
    db = client.create_database(name)
    try:
        producer = db.create_container("producer", partition_key=PartitionKey(path="/id"))
        producer.create_item(item(planted.doc("a", 12, [], 0)))
        consumer = db.create_container("consumer", partition_key=PartitionKey(path="/id"))
        archive = ensure_archive(db, archive_name("consumer"))
        store = AggregateStore(
            CosmosBackend(consumer, inbox_archive=archive),
            Counter,
            StoreConfig(inbox=InboxPolicy(window=4, spill=True)),
        )
        for message_id in _ids(range(1, 13)):
            assert store.handle("c-a", add_msg(message_id), counter_handlers, create=True).applied

        def target(container: str) -> CosmosTarget:
            return CosmosTarget(
                endpoint,
                key,
                name,
                container,
                verify=kwargs.get("connection_verify", True),
                discovery=kwargs.get("enable_endpoint_discovery", True),
            )

        spilled = read_cosmos_archive(spark, target("consumer"))
        assert {r.message_id for r in spilled.collect()} >= set(_ids(range(1, 9)))
        assert {r.aggregate_id for r in spilled.collect()} == {"c-a"}
        summary = run_audit(
            read_cosmos(spark, target("producer")),
            consumer=read_cosmos(spark, target("consumer")),
            consumer_archive=spilled,
            config=config(),
        )
        assert summary["reconciliation"]["unverifiable"] == 0
        assert summary["reconciliation"]["by_id_window"] == 12
    finally:
        client.delete_database(name)
