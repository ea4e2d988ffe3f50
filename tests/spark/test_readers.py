"""The planted collections on the MongoDB wire server, read through the MongoDB Spark
connector and through the pymongo data source: the same findings, exactly where planted."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from bson import ObjectId
from pymongo import MongoClient

from docoutbox_spark.readers import MongoTarget, count_documents, read_mongo
from docoutbox_spark.run import run_audit
from tests.spark import planted
from tests.spark.test_audit import config


@pytest.mark.parametrize("reader", ["connector", "datasource"])
def test_reader_finds_exactly_the_planted_anomalies(
    spark: Any, planted_db: Any, reader: str
) -> None:
    uri, db = planted_db
    producer = MongoTarget(uri, db, "producer")
    summary = run_audit(
        read_mongo(spark, producer, reader, partitions=3),
        consumer=read_mongo(spark, MongoTarget(uri, db, "consumer"), reader, partitions=2),
        dead_letters=read_mongo(spark, MongoTarget(uri, db, "dead"), reader, dead_letters=True),
        expected_documents=count_documents(producer),
        config=config(),
    )
    assert summary["totals"]["documents"] == len(planted.producer(big=False)) + 1
    assert planted.reported(summary) == planted.EXPECTED
    sizes = {r["aggregate_id"]: r for r in summary["rows"]["near_size_limit"]}
    assert sizes["w-big"]["size_exact"] is (reader == "datasource")


def test_datasource_reads_every_id_type_where_the_connector_misses_some(
    spark: Any, wire_server: Any
) -> None:
    client: Any = MongoClient(wire_server.uri)
    name = f"audit_{uuid.uuid4().hex[:8]}"
    ids: list[Any] = [1, 2, 3.5, "a", "b", "c", ObjectId(), ObjectId(), True]
    try:
        client[name].mixed.insert_many([planted.doc(i, 0, [], 0) for i in ids])
        target = MongoTarget(wire_server.uri, name, "mixed")
        from_source = run_audit(
            read_mongo(spark, target, "datasource", partitions=4),
            expected_documents=count_documents(target),
            config=config(),
        )
        assert from_source["totals"]["documents"] == len(ids)
        assert from_source["findings"]["unread_documents"]["count"] == 0
        # The connector's PaginateIntoPartitionsPartitioner bounds partitions with $gte/$lt
        # on _id, which match one BSON type only: documents of the other types are not read
        # (a gap recorded in tests/README.md). run_audit reports the difference between the
        # collection's count and the rows read as unread_documents (test_audit.py).
        assert read_mongo(spark, target, "connector", partitions=4).count() < len(ids)
    finally:
        client.drop_database(name)
        client.close()


def test_datasource_reads_an_empty_or_missing_collection_as_no_rows(
    spark: Any, wire_server: Any
) -> None:
    """With no _id to cut into ranges, Spark handed read() a bare InputPartition and
    every audit of an empty collection failed with an AttributeError in the worker."""
    client: Any = MongoClient(wire_server.uri)
    name = f"audit_{uuid.uuid4().hex[:8]}"
    try:
        client[name].create_collection("empty")
        for collection in ("empty", "missing"):
            target = MongoTarget(wire_server.uri, name, collection)
            summary = run_audit(
                read_mongo(spark, target, "datasource", partitions=3),
                dead_letters=read_mongo(
                    spark,
                    MongoTarget(wire_server.uri, name, "dead"),
                    "datasource",
                    dead_letters=True,
                ),
                expected_documents=count_documents(target),
                config=config(),
            )
            assert summary["totals"]["documents"] == 0
    finally:
        client.drop_database(name)
        client.close()
