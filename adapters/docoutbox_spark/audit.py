"""The audit: pure functions from DataFrames to DataFrames.

Inputs are the frames of :func:`docoutbox_spark.conform.conform` (documents, entries) and
:func:`~docoutbox_spark.conform.conform_dead_letters`. Nothing here reads or writes
anything; ``now`` is a parameter so results are reproducible.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

MONGODB_LIMIT = 16 * 1024 * 1024
COSMOS_LIMIT = 2 * 1024 * 1024
PERCENTILES = (0.5, 0.9, 0.99)


def _age(now: datetime) -> Column:
    return (F.unix_micros(F.lit(now)) - F.unix_micros(F.col("created_at"))) / 1e6


def backlog(entries: DataFrame) -> DataFrame:
    """Pending entries by message type and destination, with the oldest creation time."""
    return (
        entries.groupBy(
            F.coalesce("type", F.lit("(unknown)")).alias("type"),
            F.coalesce("destination", F.lit("(default)")).alias("destination"),
        )
        .agg(F.count(F.lit(1)).alias("pending"), F.min("created_at").alias("oldest"))
        .orderBy(F.desc("pending"), "type", "destination")
    )


def age_percentiles(entries: DataFrame, now: datetime) -> DataFrame:
    """One row: pending entries with a readable date, and their age in seconds at
    p50/p90/p99 and the maximum."""
    ages = entries.where(F.col("created_at").isNotNull()).select(_age(now).alias("age"))
    pct = F.percentile("age", list(PERCENTILES))
    return ages.agg(
        F.count(F.lit(1)).alias("pending"),
        F.get(pct, 0).alias("p50"),
        F.get(pct, 1).alias("p90"),
        F.get(pct, 2).alias("p99"),
        F.max("age").alias("max"),
    )


def stuck(entries: DataFrame, now: datetime, sla_seconds: float) -> DataFrame:
    """Entries pending for longer than the SLA."""
    return (
        entries.where(F.col("created_at").isNotNull())
        .select(
            "aggregate_id", F.col("id").alias("entry_id"), "seq", "type", _age(now).alias("age")
        )
        .where(F.col("age") > sla_seconds)
        .orderBy(F.desc("age"), "aggregate_id", "seq")
    )


def retries(entries: DataFrame) -> DataFrame:
    """Entries whose publication failed at least once, with their last error."""
    return (
        entries.where(F.col("attempts") > 0)
        .select("aggregate_id", F.col("id").alias("entry_id"), "seq", "attempts", "last_error")
        .orderBy(F.desc("attempts"), "aggregate_id", "seq")
    )


def dead_letters_by_error(dead_letters: DataFrame) -> DataFrame:
    """Quarantined entries grouped by their error."""
    return (
        dead_letters.groupBy("error")
        .agg(F.count(F.lit(1)).alias("count"), F.max("quarantined_at").alias("latest"))
        .orderBy(F.desc("count"), "error")
    )


def seq_anomalies(entries: DataFrame) -> DataFrame:
    """Per aggregate, sequence numbers missing between the lowest and highest pending entry
    (``seq_gap``) and sequence numbers held by more than one entry (``seq_duplicate``)."""
    numbered = entries.where(F.col("seq").isNotNull())
    per = numbered.groupBy("aggregate_id").agg(
        F.min("seq").alias("lo"), F.max("seq").alias("hi"), F.collect_set("seq").alias("seen")
    )
    gaps = per.select(
        "aggregate_id",
        F.explode(F.array_except(F.sequence("lo", "hi"), "seen")).alias("seq"),
    ).select(
        "aggregate_id", F.lit("seq_gap").alias("kind"), "seq", F.lit(0).cast("long").alias("count")
    )
    dups = (
        numbered.groupBy("aggregate_id", "seq")
        .agg(F.count(F.lit(1)).alias("count"))
        .where(F.col("count") > 1)
        .select("aggregate_id", F.lit("seq_duplicate").alias("kind"), "seq", "count")
    )
    return gaps.unionByName(dups).orderBy("aggregate_id", "seq", "kind")


def outbox_seq_behind(documents: DataFrame, entries: DataFrame) -> DataFrame:
    """Aggregates whose ``outbox_seq`` is lower than the ``seq`` of a pending entry."""
    top = entries.groupBy("aggregate_id").agg(F.max("seq").alias("max_seq"))
    return (
        documents.select("aggregate_id", "outbox_seq")
        .join(top, "aggregate_id")
        .where(F.col("outbox_seq").isNotNull() & (F.col("max_seq") > F.col("outbox_seq")))
        .orderBy("aggregate_id")
    )


def duplicate_entry_ids(entries: DataFrame) -> DataFrame:
    """Entry IDs found in the outbox of more than one aggregate."""
    return (
        entries.where(F.col("id").isNotNull())
        .groupBy(F.col("id").alias("entry_id"))
        .agg(F.array_sort(F.collect_set("aggregate_id")).alias("aggregates"))
        .where(F.size("aggregates") > 1)
        .orderBy("entry_id")
    )


def inbox_fill(documents: DataFrame, window: int) -> DataFrame:
    """How full the ID windows are: one row with p50/p90/p99/max inbox size and the number
    of documents whose window is full."""
    sizes = documents.select(F.coalesce(F.size("inbox"), F.lit(0)).alias("n"))
    pct = F.percentile("n", list(PERCENTILES))
    return sizes.agg(
        F.get(pct, 0).alias("p50"),
        F.get(pct, 1).alias("p90"),
        F.get(pct, 2).alias("p99"),
        F.max("n").alias("max"),
        F.sum(F.when(F.col("n") >= window, 1).otherwise(0)).alias("full"),
    )


def inbox_saturation(documents: DataFrame, window: int, above_limit: int) -> DataFrame:
    """Documents whose ID window is full (``window``: older IDs are being forgotten) and
    exact-mode marks whose ``above`` set reached ``above_limit`` (``above``: a producer's
    sequence numbers are not all reaching this receiver, so the set keeps growing)."""
    full = documents.select(
        "aggregate_id",
        F.lit("window").alias("kind"),
        F.lit(None).cast("string").alias("source"),
        F.coalesce(F.size("inbox"), F.lit(0)).alias("size"),
        F.lit(window).alias("limit"),
    ).where(F.col("size") >= window)
    marks = documents.select("aggregate_id", F.explode("inbox_marks").alias("m"))
    above = marks.select(
        "aggregate_id",
        F.lit("above").alias("kind"),
        F.col("m.source").alias("source"),
        F.coalesce(F.size("m.above"), F.lit(0)).alias("size"),
        F.lit(above_limit).alias("limit"),
    ).where(F.col("size") >= above_limit)
    return full.unionByName(above).orderBy("kind", "aggregate_id", "source")


def document_sizes(documents: DataFrame) -> DataFrame:
    """One row: document sizes (p50/p90/p99/max bytes) and the smallest headroom left under
    the MongoDB (16 MiB) and Cosmos DB (2 MiB) item limits, as fractions of each limit,
    with the headroom at p50/p90/p99 of size."""
    pct = F.percentile("size_bytes", list(PERCENTILES))
    row = documents.agg(
        F.count(F.lit(1)).alias("documents"),
        F.get(pct, 0).alias("p50"),
        F.get(pct, 1).alias("p90"),
        F.get(pct, 2).alias("p99"),
        F.max("size_bytes").alias("max"),
        F.min(F.col("size_exact").cast("int")).alias("exact"),
    )
    cols = [F.col(c) for c in row.columns]
    for name, limit in (("mongodb", MONGODB_LIMIT), ("cosmos", COSMOS_LIMIT)):
        for p in ("p50", "p90", "p99", "max"):
            cols.append((1 - F.col(p) / limit).alias(f"headroom_{name}_{p}"))
    return row.select(*cols)


def near_size_limit(documents: DataFrame, limit: int, fraction: float) -> DataFrame:
    """Documents larger than ``fraction`` of ``limit`` bytes."""
    return (
        documents.where(F.col("size_bytes") > limit * fraction)
        .select(
            "aggregate_id", "size_bytes", "size_exact", (F.col("size_bytes") / limit).alias("used")
        )
        .orderBy(F.desc("size_bytes"), "aggregate_id")
    )


def size_histogram(documents: DataFrame, limit: int, buckets: int = 10) -> DataFrame:
    """Documents per size bucket, each bucket a tenth (by default) of ``limit``."""
    bucket = F.least(F.floor(F.col("size_bytes") * buckets / limit), F.lit(buckets)).cast("int")
    return (
        documents.groupBy(bucket.alias("bucket"))
        .agg(F.count(F.lit(1)).alias("documents"))
        .orderBy("bucket")
    )


def partition_skew(documents: DataFrame, partitions: int | None = None) -> DataFrame:
    """Documents and pending entries per dispatcher partition, and each partition's
    pending entries as a multiple of the mean over ``partitions`` (default: the partitions
    seen). A dispatcher instance owns whole partitions, so a high ``ratio`` is one
    instance's backlog."""
    per = documents.groupBy("partition").agg(
        F.count(F.lit(1)).alias("documents"), F.sum("pending").alias("pending")
    )
    count = F.lit(partitions) if partitions else F.count(F.lit(1)).over(_everything())
    mean = F.sum("pending").over(_everything()) / count
    return per.select(
        "partition",
        "documents",
        "pending",
        F.when(mean > 0, F.col("pending") / mean).otherwise(F.lit(0.0)).alias("ratio"),
    ).orderBy("partition")


def _everything() -> object:
    return Window.partitionBy(F.lit(0))


def _seen(consumer_documents: DataFrame) -> DataFrame:
    marks = consumer_documents.select(
        F.col("aggregate_id").alias("consumer"), F.explode("inbox_marks").alias("m")
    ).where(F.col("m.source").isNotNull() & F.col("m.hw").isNotNull())
    low = marks.select(
        "consumer",
        F.col("m.source").alias("source"),
        F.explode(
            F.when(F.col("m.hw") >= 1, F.sequence(F.lit(1).cast("long"), "m.hw")).otherwise(
                F.array()
            )
        ).alias("seq"),
    )
    high = marks.select(
        "consumer", F.col("m.source").alias("source"), F.explode_outer("m.above").alias("seq")
    ).where(F.col("seq").isNotNull())
    return low.unionByName(high)


def reconcile(
    producer_documents: DataFrame,
    producer_entries: DataFrame,
    consumer_documents: DataFrame,
    dead_letters: DataFrame | None = None,
) -> DataFrame:
    """Match what producers emitted against what consumers recorded, by source and seq.

    A producer document with ``outbox_seq`` n emitted seqs 1..n of its stream
    (``type/_id``). Each must be pending in its outbox, quarantined as a dead letter, or
    seen by exactly one consumer document (its exact-mode ``inbox_marks``: every seq up to
    ``hw``, plus ``above``). Rows: ``lost`` (none of these), ``duplicated`` (seen by more
    than one consumer document), ``unexpected`` (a consumer saw a seq the producer never
    emitted). ``consumers`` lists the consumer documents that saw it.
    """
    producers = producer_documents.where(F.col("outbox_seq").isNotNull()).select(
        F.concat("type", F.lit("/"), "aggregate_id").alias("source"),
        F.col("aggregate_id").alias("producer"),
        "outbox_seq",
    )
    emitted = producers.select(
        "source",
        "producer",
        F.explode(
            F.when(
                F.col("outbox_seq") >= 1, F.sequence(F.lit(1).cast("long"), "outbox_seq")
            ).otherwise(F.array())
        ).alias("seq"),
    )
    pending = (
        producer_entries.where(F.col("seq").isNotNull())
        .select(F.concat("aggregate_type", F.lit("/"), "aggregate_id").alias("source"), "seq")
        .distinct()
        .withColumn("pending", F.lit(True))
    )
    seen = (
        _seen(consumer_documents)
        .join(producers.select("source", "outbox_seq"), "source")
        .groupBy("source", "seq", "outbox_seq")
        .agg(
            F.array_sort(F.collect_set("consumer")).alias("consumers"),
            F.count(F.lit(1)).alias("count"),
        )
    )
    joined = emitted.join(seen.drop("outbox_seq"), ["source", "seq"], "left").join(
        pending, ["source", "seq"], "left"
    )
    if dead_letters is not None:
        dead = (
            dead_letters.where(F.col("seq").isNotNull())
            .select("source", "seq")
            .distinct()
            .withColumn("dead", F.lit(True))
        )
        joined = joined.join(dead, ["source", "seq"], "left")
    else:
        joined = joined.withColumn("dead", F.lit(None).cast("boolean"))
    lost = joined.where(
        F.col("consumers").isNull() & F.col("pending").isNull() & F.col("dead").isNull()
    ).select(
        "source",
        "seq",
        F.lit("lost").alias("status"),
        F.array().cast("array<string>").alias("consumers"),
    )
    duplicated = joined.where(F.col("count") > 1).select(
        "source", "seq", F.lit("duplicated").alias("status"), "consumers"
    )
    unexpected = seen.where(F.col("seq") > F.col("outbox_seq")).select(
        "source", "seq", F.lit("unexpected").alias("status"), "consumers"
    )
    return lost.unionByName(duplicated).unionByName(unexpected).orderBy("status", "source", "seq")


def reconcile_ids(consumer_documents: DataFrame) -> DataFrame:
    """Message IDs recorded in the ID window of more than one consumer document
    (``duplicated``), for consumers without exact-mode marks."""
    return (
        consumer_documents.select("aggregate_id", F.explode("inbox").alias("id"))
        .groupBy("id")
        .agg(F.array_sort(F.collect_set("aggregate_id")).alias("consumers"))
        .where(F.size("consumers") > 1)
        .select("id", F.lit("duplicated").alias("status"), "consumers")
        .orderBy("id")
    )
