"""The consumers' spilled inbox IDs, for reconciliation.

Rule: a consumer whose inbox spills (``InboxPolicy(spill=True)``) keeps the IDs that left
its window in an archive beside its collection: ``<collection>.inbox`` on MongoDB and
Cosmos DB alike, one row per ID with ``aggregate_id`` and ``message_id``. The audit reads
that archive (:func:`read_mongo_archive`, :func:`read_cosmos_archive`, or the
``consumer_archive`` role of a Parquet snapshot) and :func:`with_spilled` folds its IDs
back into each consumer document's ``inbox`` before any check, so a message whose ID
was spilled is reconciled by ID like one still in the window, never reported
unverifiable or lost. Nothing else of the audit changes.
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from docoutbox_spark.readers import CosmosTarget, MongoTarget, read_cosmos, read_datasource
from docoutbox_spark.schema import RAW_ARCHIVE_SCHEMA

#: The data sources' ``kind`` of an archive read.
KIND = "inbox_archive"
#: The snapshot role (``DIR/consumer_archive``) of the consumers' archive.
ROLE = "consumer_archive"
SUFFIX = ".inbox"
#: The columns of an archive frame (a raw frame: every value as text).
SCHEMA = RAW_ARCHIVE_SCHEMA


def archive_of(collection: str) -> str:
    """The archive collection (or container) of ``collection``."""
    return f"{collection}{SUFFIX}"


def read_mongo_archive(spark: SparkSession, target: MongoTarget, partitions: int = 4) -> DataFrame:
    """The archive of ``target``'s collection, through the pymongo data source."""
    archive = replace(target, collection=archive_of(target.collection))
    return read_datasource(spark, archive, KIND, partitions)


def read_cosmos_archive(spark: SparkSession, target: CosmosTarget) -> DataFrame:
    """The archive of ``target``'s container, through the azure-cosmos data source."""
    return read_cosmos(spark, replace(target, container=archive_of(target.container)), KIND)


def with_spilled(consumer_documents: DataFrame, archive: DataFrame) -> DataFrame:
    """``consumer_documents`` (conformed) with each one's spilled IDs in its ``inbox``.

    ``archive`` is a raw archive frame (``RAW_ARCHIVE_SCHEMA``). One shuffle, by
    aggregate."""
    spilled = (
        archive.where(F.col("aggregate_id").isNotNull() & F.col("message_id").isNotNull())
        .groupBy("aggregate_id")
        .agg(F.collect_set("message_id").alias("__spilled"))
    )
    empty = F.array().cast("array<string>")
    columns = consumer_documents.columns
    return (
        consumer_documents.join(spilled, "aggregate_id", "left")
        .withColumn(
            "inbox",
            F.array_union(F.coalesce("inbox", empty), F.coalesce("__spilled", empty)),
        )
        .select(*columns)
    )
