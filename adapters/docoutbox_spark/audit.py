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


def ready_at() -> Column:
    """When an entry became publishable: its creation, or its due time if scheduled later."""
    return F.greatest(F.col("created_at"), F.col("due"))


def waiting(now: datetime) -> Column:
    """Entries with a readable date that are publishable at ``now``: a scheduled entry not
    yet due is not waiting, however old it is."""
    return F.col("created_at").isNotNull() & (F.col("due").isNull() | (F.col("due") <= now))


def age(now: datetime) -> Column:
    """Seconds an entry has waited to be published at ``now``, from :func:`ready_at`."""
    return (F.unix_micros(F.lit(now)) - F.unix_micros(ready_at())) / 1e6


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
    ages = entries.where(waiting(now)).select(age(now).alias("age"))
    pct = F.percentile("age", list(PERCENTILES))
    return ages.agg(
        F.count(F.lit(1)).alias("pending"),
        F.get(pct, 0).alias("p50"),
        F.get(pct, 1).alias("p90"),
        F.get(pct, 2).alias("p99"),
        F.max("age").alias("max"),
    )


def stuck(
    entries: DataFrame, now: datetime, sla_seconds: float, *, ordered: bool = True
) -> DataFrame:
    """Entries pending for longer than the SLA."""
    out = (
        entries.where(waiting(now))
        .select("aggregate_id", F.col("id").alias("entry_id"), "seq", "type", age(now).alias("age"))
        .where(F.col("age") > sla_seconds)
    )
    return out.orderBy(F.desc("age"), "aggregate_id", "seq") if ordered else out


def payload_sizes(entries: DataFrame) -> DataFrame:
    """One row: pending entries, how many are claim-checked (payload in a payload store),
    and the p50/p99/max of their payloads' stored size in bytes (a claim-checked entry's
    from its reference, which carries the size)."""
    pct = F.percentile("payload_bytes", [0.5, 0.99])
    return entries.agg(
        F.count(F.lit(1)).alias("entries"),
        F.count(F.when(F.col("claimed"), 1)).alias("claimed"),
        pct[0].alias("p50"),
        pct[1].alias("p99"),
        F.max("payload_bytes").alias("max"),
    )


def retries(entries: DataFrame, *, ordered: bool = True) -> DataFrame:
    """Entries whose publication failed at least once, with their last error."""
    out = entries.where(F.col("attempts") > 0).select(
        "aggregate_id", F.col("id").alias("entry_id"), "seq", "attempts", "last_error"
    )
    return out.orderBy(F.desc("attempts"), "aggregate_id", "seq") if ordered else out


def dead_letters_by_error(dead_letters: DataFrame) -> DataFrame:
    """Quarantined entries grouped by their error."""
    return (
        dead_letters.groupBy("error")
        .agg(F.count(F.lit(1)).alias("count"), F.max("quarantined_at").alias("latest"))
        .orderBy(F.desc("count"), "error")
    )


def seq_anomalies(documents: DataFrame, *, ordered: bool = True) -> DataFrame:
    """Per aggregate, sequence numbers missing between the lowest and highest pending entry
    (``seq_gap``) and sequence numbers held by more than one entry (``seq_duplicate``).

    Computed per document from its ``seqs`` (no shuffle): an aggregate's entries are all in
    its own document."""
    seqs = F.col("seqs")
    gaps = documents.where(F.size(seqs) > 0).select(
        "aggregate_id",
        F.lit("seq_gap").alias("kind"),
        F.explode(F.array_except(F.sequence(F.array_min(seqs), F.array_max(seqs)), seqs)).alias(
            "seq"
        ),
        F.lit(0).cast("long").alias("count"),
    )
    repeated = documents.select(
        "aggregate_id",
        F.explode(
            F.filter(
                F.transform(
                    F.array_distinct(seqs),
                    lambda s: F.struct(
                        s.alias("seq"),
                        F.size(F.filter(seqs, lambda x: x == s)).cast("long").alias("count"),
                    ),
                ),
                lambda r: r["count"] > 1,
            )
        ).alias("r"),
    ).select("aggregate_id", F.lit("seq_duplicate").alias("kind"), "r.seq", "r.count")
    out = gaps.unionByName(repeated)
    return out.orderBy("aggregate_id", "seq", "kind") if ordered else out


def outbox_seq_behind(documents: DataFrame, *, ordered: bool = True) -> DataFrame:
    """Aggregates whose ``outbox_seq`` is lower than the ``seq`` of a pending entry."""
    out = documents.select(
        "aggregate_id", "outbox_seq", F.array_max("seqs").alias("max_seq")
    ).where(F.col("outbox_seq").isNotNull() & (F.col("max_seq") > F.col("outbox_seq")))
    return out.orderBy("aggregate_id") if ordered else out


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


def inbox_saturation(
    documents: DataFrame, window: int, above_limit: int, *, ordered: bool = True
) -> DataFrame:
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
    out = full.unionByName(above)
    return out.orderBy("kind", "aggregate_id", "source") if ordered else out


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


def near_size_limit(
    documents: DataFrame, limit: int, fraction: float, *, ordered: bool = True
) -> DataFrame:
    """Documents larger than ``fraction`` of ``limit`` bytes."""
    out = documents.where(F.col("size_bytes") > limit * fraction).select(
        "aggregate_id", "size_bytes", "size_exact", (F.col("size_bytes") / limit).alias("used")
    )
    return out.orderBy(F.desc("size_bytes"), "aggregate_id") if ordered else out


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


#: The namespace of deterministic entry IDs (``StoreConfig(deterministic_ids=True)``,
#: :func:`docoutbox.store.plans.entry_id`).
DETERMINISTIC_NAMESPACE = "5b0a3c1e-7d2f-4c52-9a43-0d6f0c1b8e21"


def deterministic_id(source: str, seq: str) -> str:
    """The deterministic ID of entry ``seq`` of stream ``source`` (``type/aggregate_id``),
    both SQL expressions: the UUID version 5 of ``source/seq`` in
    :data:`DETERMINISTIC_NAMESPACE`, as a SQL expression."""
    name = f"concat({source}, '/', CAST({seq} AS string))"
    namespace = DETERMINISTIC_NAMESPACE.replace("-", "")
    digest = f"sha1(concat(unhex('{namespace}'), encode({name}, 'UTF-8')))"

    def part(start: int, length: int) -> str:
        return f"substring({digest}, {start + 1}, {length})"

    variant = (
        f"lower(conv(CAST(((CAST(conv({part(16, 1)}, 16, 10) AS int) & 3) | 8) AS string), 10, 16))"
    )
    return (
        f"concat({part(0, 8)}, '-', {part(8, 4)}, '-5', {part(13, 3)}, '-', {variant}, "
        f"{part(17, 3)}, '-', {part(20, 12)})"
    )


#: Reconciliation statuses of an emitted ``(source, seq)`` that account for it.
RECONCILED = ("marks", "pending", "dead_letter")
_MARK = "struct<consumer:string,hw:bigint,above:array<bigint>>"
ISSUE = "struct<seq:bigint,status:string,consumers:array<string>>"


def reconcile_sources(
    producer_documents: DataFrame,
    consumer_documents: DataFrame,
    dead_letters: DataFrame | None = None,
) -> DataFrame:
    """Per producer stream (``type/_id``): how its emitted seqs are accounted for.

    A producer document with ``outbox_seq`` n emitted seqs 1..n of its stream. Each is
    ``pending`` in its outbox, quarantined (``dead_letter``), or recorded by the consumers'
    exact-mode ``inbox_marks`` (every seq up to ``hw``, plus ``above``): by exactly one
    consumer document (``marks``) or by several (``duplicated``). A seq none of these
    accounts for is ``lost`` when some consumer document keeps an exact mark for the
    stream; when none does, its consumers de-duplicate by ID window only, which cannot
    prove a message was processed, so it is a ``candidate`` for an ID check
    (:func:`reconcile`). ``unexpected``: a consumer recorded a seq the producer never
    emitted.

    One row per stream: ``source``, ``emitted``, ``counts`` (a struct of the number of seqs
    in each status) and ``issues`` (``seq``, ``status``, ``consumers``) for every seq not
    reconciled. One shuffle, by stream.
    """
    producers = producer_documents.where(F.col("outbox_seq").isNotNull()).select(
        F.concat("type", F.lit("/"), "aggregate_id").alias("source"),
        F.col("outbox_seq"),
        F.col("seqs").alias("pending"),
        F.lit(None).cast(_MARK).alias("mark"),
        F.lit(None).cast("bigint").alias("dead"),
    )
    marks = (
        consumer_documents.select("aggregate_id", F.explode("inbox_marks").alias("m"))
        .where(F.col("m.source").isNotNull() & F.col("m.hw").isNotNull())
        .select(
            F.col("m.source").alias("source"),
            F.lit(None).cast("bigint").alias("outbox_seq"),
            F.lit(None).cast("array<bigint>").alias("pending"),
            F.struct(
                F.col("aggregate_id").alias("consumer"),
                F.col("m.hw").alias("hw"),
                F.filter(
                    F.coalesce("m.above", F.array().cast("array<bigint>")),
                    lambda a: a.isNotNull(),
                ).alias("above"),
            ).alias("mark"),
            F.lit(None).cast("bigint").alias("dead"),
        )
    )
    parts = producers.unionByName(marks)
    if dead_letters is not None:
        parts = parts.unionByName(
            dead_letters.where(F.col("source").isNotNull() & F.col("seq").isNotNull()).select(
                "source",
                F.lit(None).cast("bigint").alias("outbox_seq"),
                F.lit(None).cast("array<bigint>").alias("pending"),
                F.lit(None).cast(_MARK).alias("mark"),
                F.col("seq").alias("dead"),
            )
        )
    grouped = (
        parts.groupBy("source")
        .agg(
            F.max("outbox_seq").alias("emitted"),
            F.flatten(F.collect_list("pending")).alias("pending"),
            F.collect_list("mark").alias("marks"),
            F.collect_list("dead").alias("dead"),
        )
        .where(F.col("emitted").isNotNull())
    )
    emitted, marks = F.col("emitted"), F.col("marks")
    return (
        _with_mark_sets(grouped, emitted, marks)
        .select(
            "source",
            "emitted",
            F.when(F.size(marks) <= 1, _one_mark(emitted, marks))
            .otherwise(_any_marks(emitted, marks))
            .alias("r"),
        )
        .select("source", "emitted", "r.counts", "r.issues")
    )


def _any_marks(emitted: Column, m: Column) -> Column:
    """The statuses of :func:`reconcile_sources` (``counts``, ``issues``) of a stream
    with any number of marks, from the status of every emitted seq. ``emitted``: the
    stream's last seq; ``m``: its marks; the columns ``pending`` and ``dead`` hold its
    pending and quarantined seqs."""

    def seen(mark: Column, seq: Column) -> Column:
        return (seq <= mark["hw"]) | F.array_contains(mark["above"], seq)

    def who(seq: Column) -> Column:
        return F.array_sort(
            F.array_distinct(
                F.transform(F.filter(m, lambda k: seen(k, seq)), lambda k: k["consumer"])
            )
        )

    def status(seq: Column) -> Column:
        n = F.size(F.filter(m, lambda k: seen(k, seq)))
        return (
            F.when(n == 1, F.lit("marks"))
            .when(n > 1, F.lit("duplicated"))
            .when(F.array_contains("pending", seq), F.lit("pending"))
            .when(F.array_contains("dead", seq), F.lit("dead_letter"))
            .when(F.size(m) > 0, F.lit("lost"))
            .otherwise(F.lit("candidate"))
        )

    every = F.when(emitted >= 1, F.sequence(F.lit(1).cast("bigint"), emitted)).otherwise(
        F.array().cast("array<bigint>")
    )
    beyond = F.array_sort(
        F.array_distinct(
            F.flatten(
                F.transform(
                    m,
                    lambda k: F.concat(
                        F.when(k["hw"] > emitted, F.sequence(emitted + 1, k["hw"])).otherwise(
                            F.array().cast("array<bigint>")
                        ),
                        F.filter(k["above"], lambda a: a > emitted),
                    ),
                )
            )
        )
    )

    def count(st: Column, name: str) -> Column:
        return F.size(F.filter(st, lambda x: x["status"] == name)).cast("long").alias(name)

    def by_seq(st: Column) -> Column:
        """Every emitted seq's status: the general case, any number of marks."""
        issues = F.concat(
            F.transform(
                F.filter(st, lambda x: ~x["status"].isin(*RECONCILED)),
                lambda x: F.struct(
                    x["seq"].alias("seq"),
                    x["status"].alias("status"),
                    F.when(x["status"] == "duplicated", who(x["seq"]))
                    .otherwise(F.array().cast("array<string>"))
                    .alias("consumers"),
                ),
            ),
            F.transform(
                beyond,
                lambda s: F.struct(
                    s.alias("seq"), F.lit("unexpected").alias("status"), who(s).alias("consumers")
                ),
            ),
        ).cast(f"array<{ISSUE}>")
        counts = F.struct(
            *(count(st, name) for name in (*RECONCILED, "duplicated", "lost", "candidate")),
            F.size(beyond).cast("long").alias("unexpected"),
        )
        return F.struct(counts.alias("counts"), issues.alias("issues"))

    statuses = F.transform(every, lambda s: F.struct(s.alias("seq"), status(s).alias("status")))
    # Bound once (a lambda's argument), read by every count and the issues.
    return F.transform(F.array(statuses), by_seq)[0]


def _mark_sets(emitted: Column, marks: Column) -> list[Column]:
    """The sets :func:`_one_mark` counts, as columns (``_one``, ``_hw``, ``_above``,
    ``_beyond``; then ``_uncovered``, ``_unpending``, ``_missing``) of projections of
    their own: each is computed once per stream, where built inside the statuses' struct
    each was computed again at every use (a branch of a ``CASE`` gets no common
    subexpression elimination). Sorted by ``sort_array`` (generated code), not
    ``array_sort`` (an interpreted comparator): the elements are never null."""
    one = F.size(marks) == 1
    mark = F.get(marks, F.lit(0))
    hw = F.when(one, F.greatest(mark["hw"], F.lit(0))).otherwise(F.lit(0)).cast("bigint")
    above = F.when(one, mark["above"]).otherwise(F.array().cast("array<bigint>"))
    none = F.array().cast("array<bigint>")
    beyond = F.sort_array(
        F.array_distinct(
            F.concat(
                F.when(one & (mark["hw"] > emitted), F.sequence(emitted + 1, mark["hw"])).otherwise(
                    none
                ),
                F.filter(above, lambda a: a > emitted),
            )
        )
    )
    return [one.alias("_one"), hw.alias("_hw"), above.alias("_above"), beyond.alias("_beyond")]


def _mark_steps(emitted: Column) -> list[list[Column]]:
    """The projections after :func:`_mark_sets`, each set from the one before it."""
    none = F.array().cast("array<bigint>")
    hw = F.col("_hw")
    uncovered = F.array_except(
        F.when(emitted > hw, F.sequence(hw + 1, emitted)).otherwise(none), F.col("_above")
    )
    return [
        [uncovered.alias("_uncovered")],
        [F.array_except("_uncovered", "pending").alias("_unpending")],
        [F.array_except("_unpending", "dead").alias("_missing")],
    ]


def _with_mark_sets(frame: DataFrame, emitted: Column, marks: Column) -> DataFrame:
    """``frame`` (a stream per row: ``pending``, ``dead`` and ``emitted``, ``marks``)
    with the columns :func:`_one_mark` reads."""
    out = frame.select("*", *_mark_sets(emitted, marks))
    for step in _mark_steps(emitted):
        out = out.select("*", *step)
    return out


def _one_mark(emitted: Column, marks: Column) -> Column:
    """The statuses of :func:`reconcile_sources` for a stream with at most one mark (the
    usual case), from ranges and set operations: the seqs no mark covers are the few
    above its ``hw``, so nothing is computed per emitted seq. Reads the columns of
    :func:`_with_mark_sets`."""
    one = F.col("_one")
    mark = F.get(marks, F.lit(0))
    uncovered, unpending, missing = F.col("_uncovered"), F.col("_unpending"), F.col("_missing")
    beyond = F.col("_beyond")
    gone = F.size(missing).cast("long")
    counts = F.struct(
        (F.greatest(emitted, F.lit(0)) - F.size(uncovered)).cast("long").alias("marks"),
        F.size(F.array_intersect(uncovered, F.col("pending"))).cast("long").alias("pending"),
        F.size(F.array_intersect(unpending, F.col("dead"))).cast("long").alias("dead_letter"),
        F.lit(0).cast("long").alias("duplicated"),
        F.when(one, gone).otherwise(F.lit(0).cast("long")).alias("lost"),
        F.when(one, F.lit(0).cast("long")).otherwise(gone).alias("candidate"),
        F.size(beyond).cast("long").alias("unexpected"),
    )
    status = F.when(one, F.lit("lost")).otherwise(F.lit("candidate"))
    issues = F.concat(
        F.transform(
            missing,
            lambda s: F.struct(
                s.alias("seq"),
                status.alias("status"),
                F.array().cast("array<string>").alias("consumers"),
            ),
        ),
        F.transform(
            beyond,
            lambda s: F.struct(
                s.alias("seq"),
                F.lit("unexpected").alias("status"),
                F.array(mark["consumer"]).alias("consumers"),
            ),
        ),
    ).cast(f"array<{ISSUE}>")
    return F.struct(counts.alias("counts"), issues.alias("issues"))


def window_ids(consumer_documents: DataFrame) -> DataFrame:
    """``(id, consumer)``: every message ID held in a consumer document's ID window."""
    return consumer_documents.select(
        F.explode("inbox").alias("id"), F.col("aggregate_id").alias("consumer")
    ).where(F.col("id").isNotNull())


def reconcile(
    producer_documents: DataFrame,
    consumer_documents: DataFrame,
    dead_letters: DataFrame | None = None,
) -> DataFrame:
    """Match what producers emitted against what consumers recorded, by source and seq.

    Rows ``(source, seq, status, consumers)`` for each emitted seq that is not reconciled
    (see :func:`reconcile_sources`): ``lost``, ``duplicated``, ``unexpected``, and
    ``unverifiable``. A stream whose consumers keep no exact mark for it (ID-window
    de-duplication) is checked by ID instead: a seq whose deterministic ID
    (:func:`deterministic_id`) is still in a consumer's ID window is reconciled (or
    ``duplicated`` when in several); any other is ``unverifiable``, neither proven
    processed nor proven lost: the window forgets old IDs, and random IDs cannot be
    recomputed. Exact mode (``InboxPolicy(exact=True)``) gives the full check.
    """
    issues = (
        reconcile_sources(producer_documents, consumer_documents, dead_letters)
        .select("source", F.explode("issues").alias("i"))
        .select("source", "i.seq", "i.status", "i.consumers")
    )
    candidates = issues.where(F.col("status") == "candidate").select(
        "source", "seq", F.expr(deterministic_id("source", "seq")).alias("id")
    )
    held = (
        window_ids(consumer_documents)
        .groupBy("id")
        .agg(F.array_sort(F.collect_set("consumer")).alias("held_by"))
    )
    checked = candidates.join(held, "id", "left").select(
        "source",
        "seq",
        F.when(F.col("held_by").isNull(), F.lit("unverifiable"))
        .when(F.size("held_by") > 1, F.lit("duplicated"))
        .otherwise(F.lit("reconciled"))
        .alias("status"),
        F.coalesce(
            F.when(F.size("held_by") > 1, F.col("held_by")), F.array().cast("array<string>")
        ).alias("consumers"),
    )
    return (
        issues.where(F.col("status") != "candidate")
        .unionByName(checked.where(F.col("status") != "reconciled"))
        .orderBy("status", "source", "seq")
    )


def reconcile_ids(consumer_documents: DataFrame) -> DataFrame:
    """Message IDs recorded in the ID window of more than one consumer document
    (``duplicated``), for consumers without exact-mode marks."""
    return (
        window_ids(consumer_documents)
        .groupBy("id")
        .agg(F.array_sort(F.collect_set("consumer")).alias("consumers"))
        .where(F.size("consumers") > 1)
        .select("id", F.lit("duplicated").alias("status"), "consumers")
        .orderBy("id")
    )
