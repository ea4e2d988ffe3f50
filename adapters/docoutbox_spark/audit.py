"""The audit: pure functions from DataFrames to DataFrames.

Inputs are the frames of :func:`docoutbox_spark.conform.conform` (documents, entries) and
:func:`~docoutbox_spark.conform.conform_dead_letters`. Nothing here reads or writes
anything; ``now`` is a parameter so results are reproducible.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from docoutbox_spark.sqltext import literal

MONGODB_LIMIT = 16 * 1024 * 1024
COSMOS_LIMIT = 2 * 1024 * 1024
PERCENTILES = (0.5, 0.9, 0.99)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(now: datetime) -> int:
    """``now`` in microseconds since the epoch (a naive ``now`` is local time, as Spark
    reads a naive Python datetime)."""
    aware = now if now.tzinfo is not None else now.astimezone()
    return (aware - EPOCH) // timedelta(microseconds=1)


def waiting_sql(now: datetime) -> str:
    """Entries with a readable date that are publishable at ``now``, as SQL: a scheduled
    entry not yet due is not waiting, however old it is."""
    return f"created_at IS NOT NULL AND (due IS NULL OR due <= timestamp_micros({_micros(now)}))"


def age_sql(now: datetime) -> str:
    """Seconds an entry has waited to be published at ``now``, as SQL: from its creation,
    or its due time if scheduled later."""
    return f"({_micros(now)} - unix_micros(greatest(created_at, due))) / 1e6"


def waiting(now: datetime) -> Column:
    """:func:`waiting_sql` as a Column."""
    return F.expr(waiting_sql(now))


def age(now: datetime) -> Column:
    """:func:`age_sql` as a Column."""
    return F.expr(age_sql(now))


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
        entries.where(waiting_sql(now))
        .selectExpr("aggregate_id", "id AS entry_id", "seq", "`type`", f"{age_sql(now)} AS age")
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
    out = entries.where("attempts > 0").selectExpr(
        "aggregate_id", "id AS entry_id", "seq", "attempts", "last_error"
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
    gaps = documents.where("size(seqs) > 0").selectExpr(
        "aggregate_id",
        "'seq_gap' AS kind",
        "explode(array_except(sequence(array_min(seqs), array_max(seqs)), seqs)) AS seq",
        "CAST(0 AS bigint) AS `count`",
    )
    repeated = documents.selectExpr(
        "aggregate_id",
        "explode(filter(transform(array_distinct(seqs), s -> named_struct('seq', s, "
        "'count', CAST(size(filter(seqs, x -> x = s)) AS bigint))), r -> r.`count` > 1)) AS r",
    ).selectExpr("aggregate_id", "'seq_duplicate' AS kind", "r.seq", "r.`count`")
    out = gaps.unionByName(repeated)
    return out.orderBy("aggregate_id", "seq", "kind") if ordered else out


def outbox_seq_behind(documents: DataFrame, *, ordered: bool = True) -> DataFrame:
    """Aggregates whose ``outbox_seq`` is lower than the ``seq`` of a pending entry."""
    out = documents.selectExpr("aggregate_id", "outbox_seq", "array_max(seqs) AS max_seq").where(
        "outbox_seq IS NOT NULL AND max_seq > outbox_seq"
    )
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
    full = documents.selectExpr(
        "aggregate_id",
        "'window' AS kind",
        "CAST(NULL AS string) AS source",
        "coalesce(size(inbox), 0) AS `size`",
        f"{int(window)} AS `limit`",
    ).where(f"`size` >= {int(window)}")
    marks = documents.selectExpr("aggregate_id", "explode(inbox_marks) AS m")
    above = marks.selectExpr(
        "aggregate_id",
        "'above' AS kind",
        "m.source AS source",
        "coalesce(size(m.above), 0) AS `size`",
        f"{int(above_limit)} AS `limit`",
    ).where(f"`size` >= {int(above_limit)}")
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
    out = documents.where(F.col("size_bytes") > limit * fraction).selectExpr(
        "aggregate_id", "size_bytes", "size_exact", f"size_bytes / {int(limit)} AS used"
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
    producers = producer_documents.where("outbox_seq IS NOT NULL").selectExpr(
        "concat(`type`, '/', aggregate_id) AS source",
        "outbox_seq",
        "seqs AS pending",
        f"CAST(NULL AS {_MARK}) AS mark",
        "CAST(NULL AS bigint) AS dead",
    )
    marks = (
        consumer_documents.selectExpr("aggregate_id", "explode(inbox_marks) AS m")
        .where("m.source IS NOT NULL AND m.hw IS NOT NULL")
        .selectExpr(
            "m.source AS source",
            "CAST(NULL AS bigint) AS outbox_seq",
            f"{_NONE} AS pending",
            "CAST(named_struct('consumer', aggregate_id, 'hw', m.hw, 'above', "
            f"filter(coalesce(m.above, {_NONE}), a -> a IS NOT NULL)) AS {_MARK}) AS mark",
            "CAST(NULL AS bigint) AS dead",
        )
    )
    parts = producers.unionByName(marks)
    if dead_letters is not None:
        parts = parts.unionByName(
            dead_letters.where("source IS NOT NULL AND seq IS NOT NULL").selectExpr(
                "source",
                "CAST(NULL AS bigint) AS outbox_seq",
                f"{_NONE} AS pending",
                f"CAST(NULL AS {_MARK}) AS mark",
                "seq AS dead",
            )
        )
    grouped = (
        parts.groupBy("source")
        .agg(
            F.expr("max(outbox_seq) AS emitted"),
            F.expr("flatten(collect_list(pending)) AS pending"),
            F.expr("collect_list(mark) AS marks"),
            F.expr("collect_list(dead) AS dead"),
        )
        .where("emitted IS NOT NULL")
    )
    one, every = _one_mark("emitted", "marks"), _any_marks("emitted", "marks")
    return (
        _with_mark_sets(grouped, "emitted", "marks")
        .selectExpr(
            "source",
            "emitted",
            f"CASE WHEN size(marks) <= 1 THEN {one} ELSE {every} END AS r",
        )
        .selectExpr("source", "emitted", "r.counts", "r.issues")
    )


#: An empty array of seqs, as SQL.
_NONE = "CAST(array() AS array<bigint>)"


def _any_marks(emitted: str, m: str) -> str:
    """The statuses of :func:`reconcile_sources` (``counts``, ``issues``) of a stream
    with any number of marks, from the status of every emitted seq, as SQL. ``emitted``:
    the stream's last seq; ``m``: its marks (SQL expressions); the columns ``pending`` and
    ``dead`` hold its pending and quarantined seqs."""

    def seen(seq: str) -> str:
        return f"filter({m}, k -> {seq} <= k.hw OR array_contains(k.above, {seq}))"

    def who(seq: str) -> str:
        return f"array_sort(array_distinct(transform({seen(seq)}, k -> k.consumer)))"

    status = (
        f"CASE WHEN size({seen('s')}) = 1 THEN 'marks' "
        f"WHEN size({seen('s')}) > 1 THEN 'duplicated' "
        "WHEN array_contains(pending, s) THEN 'pending' "
        "WHEN array_contains(dead, s) THEN 'dead_letter' "
        f"WHEN size({m}) > 0 THEN 'lost' ELSE 'candidate' END"
    )
    every = f"CASE WHEN {emitted} >= 1 THEN sequence(CAST(1 AS bigint), {emitted}) ELSE {_NONE} END"
    beyond = (
        f"array_sort(array_distinct(flatten(transform({m}, k -> concat("
        f"CASE WHEN k.hw > {emitted} THEN sequence({emitted} + 1, k.hw) ELSE {_NONE} END, "
        f"filter(k.above, a -> a > {emitted}))))))"
    )
    reconciled = ", ".join(literal(name) for name in RECONCILED)
    issues = (
        "CAST(concat("
        f"transform(filter(st, x -> NOT x.status IN ({reconciled})), x -> named_struct("
        "'seq', x.seq, 'status', x.status, 'consumers', "
        f"CASE WHEN x.status = 'duplicated' THEN {who('x.seq')} "
        "ELSE CAST(array() AS array<string>) END)), "
        f"transform({beyond}, s -> named_struct('seq', s, 'status', 'unexpected', "
        f"'consumers', {who('s')}))"
        f") AS array<{ISSUE}>)"
    )
    counts = ", ".join(
        f"{literal(name)}, CAST(size(filter(st, x -> x.status = {literal(name)})) AS bigint)"
        for name in (*RECONCILED, "duplicated", "lost", "candidate")
    )
    counts += f", 'unexpected', CAST(size({beyond}) AS bigint)"
    statuses = f"transform({every}, s -> named_struct('seq', s, 'status', {status}))"
    # Bound once (a lambda's argument), read by every count and the issues.
    by_seq = f"named_struct('counts', named_struct({counts}), 'issues', {issues})"
    return f"get(transform(array({statuses}), st -> {by_seq}), 0)"


def _mark_sets(emitted: str, marks: str) -> list[str]:
    """The sets :func:`_one_mark` counts, as SQL (``_one``, ``_hw``, ``_above``,
    ``_beyond``; then ``_uncovered``, ``_unpending``, ``_missing``) of projections of
    their own: each is computed once per stream, where built inside the statuses' struct
    each was computed again at every use (a branch of a ``CASE`` gets no common
    subexpression elimination). Sorted by ``sort_array`` (generated code), not
    ``array_sort`` (an interpreted comparator): the elements are never null."""
    one = f"size({marks}) = 1"
    mark = f"get({marks}, 0)"
    above = f"CASE WHEN {one} THEN {mark}.above ELSE {_NONE} END"
    beyond = (
        "sort_array(array_distinct(concat("
        f"CASE WHEN {one} AND {mark}.hw > {emitted} THEN sequence({emitted} + 1, {mark}.hw) "
        f"ELSE {_NONE} END, filter({above}, a -> a > {emitted}))))"
    )
    return [
        f"{one} AS _one",
        f"CAST(CASE WHEN {one} THEN greatest({mark}.hw, 0) ELSE 0 END AS bigint) AS _hw",
        f"{above} AS _above",
        f"{beyond} AS _beyond",
    ]


def _mark_steps(emitted: str) -> list[str]:
    """The projections after :func:`_mark_sets`, each set from the one before it."""
    return [
        "array_except(CASE WHEN "
        f"{emitted} > _hw THEN sequence(_hw + 1, {emitted}) ELSE {_NONE} END, _above) "
        "AS _uncovered",
        "array_except(_uncovered, pending) AS _unpending",
        "array_except(_unpending, dead) AS _missing",
    ]


def _with_mark_sets(frame: DataFrame, emitted: str, marks: str) -> DataFrame:
    """``frame`` (a stream per row: ``pending``, ``dead`` and ``emitted``, ``marks``, SQL
    expressions) with the columns :func:`_one_mark` reads."""
    out = frame.selectExpr("*", *_mark_sets(emitted, marks))
    for step in _mark_steps(emitted):
        out = out.selectExpr("*", step)
    return out


def _one_mark(emitted: str, marks: str) -> str:
    """The statuses of :func:`reconcile_sources` for a stream with at most one mark (the
    usual case), from ranges and set operations, as SQL: the seqs no mark covers are the
    few above its ``hw``, so nothing is computed per emitted seq. Reads the columns of
    :func:`_with_mark_sets`."""
    counts = (
        f"'marks', CAST(greatest({emitted}, 0) - size(_uncovered) AS bigint), "
        "'pending', CAST(size(array_intersect(_uncovered, pending)) AS bigint), "
        "'dead_letter', CAST(size(array_intersect(_unpending, dead)) AS bigint), "
        "'duplicated', CAST(0 AS bigint), "
        "'lost', CAST(CASE WHEN _one THEN size(_missing) ELSE 0 END AS bigint), "
        "'candidate', CAST(CASE WHEN _one THEN 0 ELSE size(_missing) END AS bigint), "
        "'unexpected', CAST(size(_beyond) AS bigint)"
    )
    issues = (
        "CAST(concat("
        "transform(_missing, s -> named_struct('seq', s, "
        "'status', CASE WHEN _one THEN 'lost' ELSE 'candidate' END, "
        "'consumers', CAST(array() AS array<string>))), "
        "transform(_beyond, s -> named_struct('seq', s, 'status', 'unexpected', "
        f"'consumers', array(get({marks}, 0).consumer)))"
        f") AS array<{ISSUE}>)"
    )
    return f"named_struct('counts', named_struct({counts}), 'issues', {issues})"


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
