"""Run every audit over the frames and collect a JSON-ready summary with its findings.

One pass: each source is read once (its conformed rows persisted, every source in one
Spark job), and every finding and figure is computed in one query with four shuffles
(reconciliation by stream; message IDs and the streams' issues; the figures' few groups;
a per-kind ranking), then collected in one bounded result: at most ``sample`` rows per
finding kind with each kind's exact count, and the figures (totals, percentiles, backlog
by type, partitions, size buckets, dead letters by error). An audit takes six Spark jobs,
whatever the number of sources.
Nothing collected grows with the collections.

Timestamps are carried as microseconds since the epoch and rendered as UTC here, so the
summary is the same whatever the machine's or the Spark session's time zone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from docoutbox.errors import DocOutboxError
from docoutbox_spark import audit
from docoutbox_spark.conform import Conformed, conform, conform_dead_letters
from docoutbox_spark.spilled import with_spilled
from docoutbox_spark.sqltext import aliased, empty, literal, name

# Finding kinds, and how many of each are allowed before the audit fails (None: never).
DEFAULT_THRESHOLDS: dict[str, int | None] = {
    "malformed": 0,
    "unread_documents": 0,
    "stuck": 0,
    "seq_gap": 0,
    "seq_duplicate": 0,
    "outbox_seq_behind": 0,
    "duplicate_entry_id": 0,
    "near_size_limit": 0,
    "inbox_above": 0,
    "lost": 0,
    "duplicated": 0,
    "unexpected": 0,
    "unverifiable": None,
    "retrying": None,
    "dead_letter": None,
    "inbox_window_full": None,
    "partition_skew": None,
}

#: Persisted sources are kept as objects (read back without deserializing them, as each
#: branch of the query reads them again), and spill to disk when memory is short.
LEVEL = StorageLevel.MEMORY_AND_DISK_DESER
#: The fields of the outbox entries the audit reads: only these are persisted.
ENTRY_FIELDS = (
    "id",
    "type",
    "destination",
    "created_at",
    "due",
    "seq",
    "attempts",
    "last_error",
)
#: Rows kept of the figures that are lists.
BACKLOG_ROWS = 500
DEAD_LETTER_ROWS = 200
#: Relative rank error of the percentiles (``percentile_approx`` accuracy 10,000).
PERCENTILE_ACCURACY = 10_000


@dataclass(frozen=True)
class AuditConfig:
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    sla_seconds: float = 300.0
    window: int = 100
    above_limit: int = 100
    size_limit: int = audit.MONGODB_LIMIT
    size_fraction: float = 0.8
    partitions: int | None = None
    skew_ratio: float = 4.0
    skew_min_pending: int = 100
    sample: int = 200  # finding rows kept per kind in the summary
    thresholds: dict[str, int | None] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.astimezone()
        return aware.astimezone(UTC).isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _instant(micros: Any) -> str | None:
    """Microseconds since the epoch as an ISO 8601 UTC instant."""
    if micros is None:
        return None
    return (audit.EPOCH + timedelta(microseconds=int(micros))).isoformat()


# --- the one result frame: (kind, sort, row) --------------------------------------------
#
# The result rows are built as SQL text, each frame's in one projection: the driver makes
# one JVM call per projection instead of several per field, which is most of the time an
# audit of a small collection takes to build its query.

_SORT = "struct<a:double,b:string,c:double,d:string>"
#: A row of the one result: its finding kind (or figure), its order within the kind, the
#: row as JSON, and a number the kind sums (counts that are not rows).
_ITEM = f"struct<kind:string,sort:{_SORT},row:string,n:bigint>"
_CAND = "struct<source:string,seq:bigint>"
#: The fields of a row keyed for the shuffle by message ID and figure, after ``ns`` and
#: ``a`` (``ns``: ``i`` a message ID in ``a``; ``f`` a figure, group ``a`` keyed by ``b``,
#: ``c``; ``s`` a stream's issues).
_KEYED_FIELDS = (
    ("b", "string"),
    ("c", "string"),
    ("cand", _CAND),
    ("consumer", "string"),
    ("producer", "string"),
    ("issues", f"array<{audit.ISSUE}>"),
    ("n", "bigint"),
    ("pending", "bigint"),
    ("flag", "bigint"),
    ("v", "double"),
    ("x", "bigint"),
    ("t", "bigint"),
)
_KEYED = (
    "struct<ns:string,a:string,"
    + ",".join(f"{field}:{kind}" for field, kind in _KEYED_FIELDS)
    + ">"
)


def _json(struct: str) -> str:
    """The JSON object of the SQL struct ``struct``, nulls kept."""
    return f"to_json({struct}, map('ignoreNullFields', 'false'))"


_EMPTY = "''"


def _fields(values: list[tuple[str, str]]) -> str:
    return ", ".join(f"{literal(field)}, {value}" for field, value in values)


def _item_parts(
    kind: str,
    row: str,
    a: str | None = None,
    b: str | None = None,
    c: str | None = None,
    d: str | None = None,
    n: str | None = None,
) -> list[tuple[str, str]]:
    """A result row's fields as SQL: ``kind`` its label (an expression), ``row`` its JSON,
    ``a, b, c, d`` its order within the kind, ``n`` what the kind sums."""
    sort = _fields(
        [
            ("a", f"CAST({a or '0D'} AS double)"),
            ("b", f"CAST({b or _EMPTY} AS string)"),
            ("c", f"CAST({c or '0D'} AS double)"),
            ("d", f"CAST({d or _EMPTY} AS string)"),
        ]
    )
    return [
        ("kind", kind),
        ("sort", f"named_struct({sort})"),
        ("row", row),
        ("n", f"CAST({n or '1'} AS bigint)"),
    ]


def _item_of(kind: str, row: str, **order: str | None) -> str:
    """A result row as one SQL struct (see :func:`_item_parts`)."""
    return f"named_struct({_fields(_item_parts(kind, row, **order))})"


def _item(
    kind: str,
    frame: DataFrame,
    a: str | None = None,
    b: str | None = None,
    c: str | None = None,
    d: str | None = None,
    *,
    label: str | None = None,
) -> DataFrame:
    """``frame``'s rows as result rows of ``kind`` (or of the SQL expression ``label``):
    ``row`` is the JSON of every column (nulls kept), ``sort`` orders the kind's rows
    (``a, b, c, d``, SQL expressions)."""
    row = _json(f"struct({', '.join(name(column) for column in frame.columns)})")
    parts = _item_parts(label or literal(kind), row, a, b, c, d)
    return frame.selectExpr(*aliased(parts))


def _keyed_parts(ns: str, a: str, **values: str | None) -> list[tuple[str, str]]:
    unknown = set(values) - {field for field, _ in _KEYED_FIELDS}
    if unknown:
        raise ValueError(f"unknown keyed fields: {sorted(unknown)}")
    parts = [("ns", literal(ns)), ("a", f"CAST({a} AS string)")]
    for column, kind in _KEYED_FIELDS:
        parts.append((column, f"CAST({values.get(column) or 'NULL'} AS {kind})"))
    return parts


def _keyed_of(ns: str, a: str, **values: str | None) -> str:
    """A keyed row as one SQL struct (``a`` and ``values``: SQL expressions)."""
    return f"named_struct({_fields(_keyed_parts(ns, a, **values))})"


def _keyed(frame: DataFrame, ns: str, a: str, **values: str | None) -> DataFrame:
    parts = _keyed_parts(ns, a, **values)
    return frame.selectExpr(*aliased(parts))


def _fact(
    frame: DataFrame,
    group: str,
    *,
    k1: str | None = None,
    k2: str | None = None,
    n: str | None = None,
    **values: str | None,
) -> DataFrame:
    """One contribution to a figure: rows of ``group`` (keyed by ``k1``, ``k2``) are summed
    (``n``, ``pending``, ``flag``), ranked (percentiles and maximum of ``v``), and bounded
    (minimum of ``x``, minimum and maximum of the instant ``t`` in microseconds). Values
    are SQL expressions."""
    return _keyed(frame, "f", literal(group), b=k1, c=k2, n=n or "1", **values)


def _on(condition: str) -> str:
    return f"CASE WHEN {condition} THEN 1 ELSE 0 END"


def run_audit(
    producer: DataFrame,
    *,
    consumer: DataFrame | None = None,
    dead_letters: DataFrame | None = None,
    expected_documents: int | None = None,
    config: AuditConfig | None = None,
    source: dict[str, Any] | None = None,
    consumer_archive: DataFrame | None = None,
) -> dict[str, Any]:
    """Audit raw frames; return the summary (JSON-ready) with findings and figures.

    ``consumer_archive``: the consumers' spilled inbox IDs (:mod:`docoutbox_spark.spilled`),
    which count as held in their windows.

    Spark jobs: one that reads every source once (their conformed rows persisted), then one
    query of four shuffles and its result: six, whatever the number of sources."""
    config = config or AuditConfig()
    persisted: list[Conformed | DataFrame] = []
    try:
        produced = conform(producer, persist=LEVEL, read=False, entry_fields=ENTRY_FIELDS)
        persisted.append(produced)
        items, facts, keyed = _producer_parts(produced, config)
        dead = None
        if dead_letters is not None:
            dead = conform_dead_letters(dead_letters).persist(LEVEL)
            persisted.append(dead)
            items.append(
                _item(
                    "dead_letter",
                    dead.select("id", "aggregate_id", "entry_id", "error"),
                    b="id",
                )
            )
            facts.append(_fact(dead, "dead_error", k1="error", t="unix_micros(quarantined_at)"))
        if consumer is not None:
            consumed = conform(consumer, persist=LEVEL, read=False, entry_fields=ENTRY_FIELDS)
            persisted.append(consumed)
            cdocs = consumed.documents
            if consumer_archive is not None:
                cdocs = with_spilled(cdocs, consumer_archive)
            items += [
                _item(
                    "malformed",
                    consumed.malformed.withColumn("kind", F.lit("malformed_consumer")),
                    a="1",
                    b="aggregate_id",
                    d="entry_id",
                ),
                _saturation(cdocs, "consumer", config),
            ]
            facts.append(_fact(cdocs, "consumer_documents"))
            keyed += [
                _keyed(audit.window_ids(cdocs), "i", "id", consumer="consumer"),
                _by_stream(audit.reconcile_sources(produced.documents, cdocs, dead)),
            ]
        read_once(persisted)
        items += [_by_key(_union(keyed)), _figures(_union(facts))]
        rows = _collect(_union(items), config.sample)
    finally:
        for frame in persisted:
            frame.unpersist()
    return _summary(rows, config, expected_documents, source, consumer is not None, dead)


def read_once(frames: list[Conformed | DataFrame]) -> None:
    """Fill the caches of persisted ``frames`` in one Spark job, so that each source is
    read once, before anything is computed from it."""
    cached = [
        part
        for frame in frames
        for part in (frame.persisted if isinstance(frame, Conformed) else (frame,))
    ]
    marks = [part.select(F.lit(0).alias("x")) for part in cached]
    if marks:
        _union(marks).write.format("noop").mode("overwrite").save()


class ColumnsMismatch(DocOutboxError, ValueError):
    """Frames to be unioned whose columns differ (a fault of the audit's own query)."""


def _union(frames: list[DataFrame]) -> DataFrame:
    """The rows of ``frames``, which all carry the columns of the first in its order
    (checked): unioned by position, one JVM call per frame. (A ``UNION ALL`` of SQL text
    over the frames registers each as a view and parses and analyses the whole text, and
    ``unionByName`` resolves the names again at each call: each costs the driver more.)"""
    columns = frames[0].columns
    for frame in frames[1:]:
        if frame.columns != columns:
            raise ColumnsMismatch(f"cannot union {frame.columns} with {columns}")
    out = frames[0]
    for frame in frames[1:]:
        out = out.union(frame)
    return out


def _saturation(documents: DataFrame, collection: str, config: AuditConfig) -> DataFrame:
    found = audit.inbox_saturation(documents, config.window, config.above_limit, ordered=False)
    found = found.withColumn("collection", F.lit(collection))
    kind = "CASE WHEN kind = 'window' THEN 'inbox_window_full' ELSE 'inbox_above' END"
    return _item("", found, b="aggregate_id", d="source", label=kind)


def _producer_parts(
    produced: Conformed, config: AuditConfig
) -> tuple[list[DataFrame], list[DataFrame], list[DataFrame]]:
    """The producer's findings that need no shuffle, its contributions to the figures, and
    its rows for the shuffle by message ID."""
    docs, entries = produced.documents, produced.entries
    items = [
        _item("malformed", produced.malformed, b="aggregate_id", d="entry_id"),
        _item(
            "stuck",
            audit.stuck(entries, config.now, config.sla_seconds, ordered=False),
            a="-age",
            b="aggregate_id",
            c="seq",
        ),
        _item(
            "retrying",
            audit.retries(entries, ordered=False),
            a="-attempts",
            b="aggregate_id",
            c="seq",
        ),
        _item(
            "",
            audit.seq_anomalies(docs, ordered=False),
            b="aggregate_id",
            c="seq",
            label="kind",
        ),
        _item("outbox_seq_behind", audit.outbox_seq_behind(docs, ordered=False), b="aggregate_id"),
        _item(
            "near_size_limit",
            audit.near_size_limit(docs, config.size_limit, config.size_fraction, ordered=False),
            a="-size_bytes",
            b="aggregate_id",
        ),
        _saturation(docs, "producer", config),
    ]
    inbox = "coalesce(size(inbox), 0)"
    bucket = f"least(floor(size_bytes * 10 / {int(config.size_limit)}), 10)"
    ages = entries.where(audit.waiting_sql(config.now)).selectExpr(
        f"{audit.age_sql(config.now)} AS age"
    )
    facts = [
        _fact(
            docs,
            "documents",
            pending="pending",
            flag=_on("pending > 0"),
            v="size_bytes",
            x="CAST(size_exact AS int)",
        ),
        _fact(docs, "inbox", v=inbox, flag=_on(f"{inbox} >= {int(config.window)}")),
        _fact(docs, "partition", k1="`partition`", pending="pending"),
        _fact(docs, "histogram", k1=bucket),
        _fact(ages, "ages", v="age"),
        _fact(
            entries,
            "backlog",
            k1="coalesce(`type`, '(unknown)')",
            k2="coalesce(destination, '(default)')",
            t="unix_micros(created_at)",
        ),
    ]
    keyed = [_keyed(entries.where("id IS NOT NULL"), "i", "id", producer="aggregate_id")]
    return items, facts, keyed


def _by_stream(sources: DataFrame) -> DataFrame:
    """The reconciliation by stream (:func:`~docoutbox_spark.audit.reconcile_sources`) as
    rows for the shuffle by key, in one pass over it: each seq to check by ID, the counts,
    and the stream's other issues."""
    candidate = "filter(issues, i -> i.status = 'candidate')"
    others = "filter(issues, i -> i.status != 'candidate')"
    checked = _keyed_of(
        "i",
        audit.deterministic_id("source", "i.seq"),
        cand="named_struct('source', source, 'seq', i.seq)",
    )
    counts = [
        _keyed_of("f", "'reconciliation'", b=literal(status), n=f"counts.{status}")
        for status in (*audit.RECONCILED, "duplicated", "lost", "unexpected")
    ]
    emitted = _keyed_of("f", "'reconciliation'", b="'emitted'", n="emitted")
    issues = _keyed_of("s", "source", issues=others)
    # Only the counts that are not zero: most of a stream's are, and each row is shuffled.
    summed = f"filter(array({', '.join([emitted, *counts])}), k -> k.n != 0)"
    rows = (
        f"concat(transform({candidate}, i -> {checked}), {summed}, "
        f"CASE WHEN size({others}) > 0 THEN array({issues}) ELSE {empty(_KEYED)} END)"
    )
    return sources.selectExpr(f"explode(CAST({rows} AS array<{_KEYED}>)) AS k").select("k.*")


#: The columns of a figure's aggregation, as its result row carries them.
_FIGURE_COLUMNS = ("n", "pending", "flag", "values", "pct", "max", "xmin", "tmin", "tmax")


def _figure() -> list[tuple[str, str]]:
    """The result row of a figure (``a``: its group, keyed by ``b``, ``c``) from the
    columns of :data:`_FIGURE_COLUMNS`, as SQL."""
    row = _json(
        "named_struct('group', a, 'k1', b, 'k2', c, "
        + ", ".join(f"{literal(column)}, {name(column)}" for column in _FIGURE_COLUMNS)
        + ")"
    )
    order = (
        "CASE WHEN a IN ('backlog', 'dead_error') THEN -n "
        "WHEN a IN ('partition', 'histogram') THEN CAST(b AS double) END"
    )
    return _item_parts("concat('figure:', a)", row, a=order, b="b", d="c", n="n")


def _exprs(*expressions: str) -> list[Column]:
    """SQL ``expressions`` as Columns (for ``agg``, which takes no SQL text)."""
    return [F.expr(expression) for expression in expressions]


def _figures(facts: DataFrame) -> DataFrame:
    """The figures: one aggregation over the few groups of :func:`_fact` (sums, counts,
    percentiles, bounds), which each task folds to a row per group before the shuffle."""
    percentiles = ", ".join(f"{float(p)!r}D" for p in audit.PERCENTILES)
    grouped = facts.groupBy("a", "b", "c").agg(
        *_exprs(
            "sum(n) AS n",
            "sum(pending) AS pending",
            "sum(flag) AS flag",
            "count(v) AS `values`",
            f"percentile_approx(v, array({percentiles}), {PERCENTILE_ACCURACY}) AS pct",
            "max(v) AS max",
            "min(x) AS xmin",
            "min(t) AS tmin",
            "max(t) AS tmax",
        )
    )
    return grouped.selectExpr(*aliased(_figure()))


def _by_key(keyed: DataFrame) -> DataFrame:
    """One shuffle by key, and every result row it yields, in one pass over its output:
    entry IDs in several producers' outboxes, IDs in several consumers' windows, the ID
    check of streams whose consumers keep no exact marks, the streams' issues, and the
    reconciliation's counts. Its aggregates are the lists a message ID needs and one sum;
    the figures, which need percentiles, have their own aggregation (:func:`_figures`)."""
    grouped = keyed.groupBy("ns", "a", "b", "c").agg(
        *_exprs(
            "collect_list(cand) AS cands",
            # sort_array: generated code; a set holds no null.
            "sort_array(collect_set(consumer)) AS consumers",
            "sort_array(collect_set(producer)) AS aggregates",
            "flatten(collect_list(issues)) AS issues",
            "sum(n) AS n",
        )
    )
    # The reconciliation's counts are figures with a sum only.
    grouped = grouped.selectExpr(
        "*",
        "CAST(NULL AS bigint) AS pending",
        "CAST(NULL AS bigint) AS flag",
        "CAST(0 AS bigint) AS `values`",
        "CAST(NULL AS array<double>) AS pct",
        "CAST(NULL AS double) AS max",
        "CAST(NULL AS bigint) AS xmin",
        "CAST(NULL AS bigint) AS tmin",
        "CAST(NULL AS bigint) AS tmax",
    )

    def when(condition: str, values: str) -> str:
        return f"CASE WHEN {condition} THEN {values} ELSE {empty(_ITEM)} END"

    is_id = "ns = 'i'"
    figure = f"named_struct({_fields(_figure())})"
    duplicate = _item_of(
        "'duplicate_entry_id'",
        _json("named_struct('entry_id', a, 'aggregates', aggregates)"),
        b="a",
    )
    duplicated = _item_of(
        "'duplicated'",
        _json("named_struct('entry_id', a, 'status', 'duplicated', 'consumers', consumers)"),
        a="1",
        b="a",
    )
    unverifiable = _item_of(
        "'unverifiable'",
        _json("named_struct('source', m.source, 'seq', m.seq, 'status', 'unverifiable')"),
        b="m.source",
        c="m.seq",
    )
    issue = _item_of(
        "i.status",
        _json(
            "named_struct('source', a, 'seq', i.seq, 'status', i.status, 'consumers', i.consumers)"
        ),
        b="a",
        c="i.seq",
    )
    rows = ", ".join(
        [
            when(f"{is_id} AND size(aggregates) > 1", f"array({duplicate})"),
            when(f"{is_id} AND size(consumers) > 1", f"array({duplicated})"),
            when(f"{is_id} AND size(consumers) = 0", f"transform(cands, m -> {unverifiable})"),
            when(
                f"{is_id} AND size(consumers) > 0 AND size(cands) > 0",
                f"array({_item_of(literal('count:id_window'), literal('{}'), n='size(cands)')})",
            ),
            when("ns = 's'", f"transform(issues, i -> {issue})"),
            when("ns = 'f'", f"array({figure})"),
        ]
    )
    return grouped.selectExpr(f"explode(CAST(concat({rows}) AS array<{_ITEM}>)) AS item").select(
        "item.*"
    )


_Collected = dict[str, tuple[int, int, list[dict[str, Any]]]]


def _collect(everything: DataFrame, sample: int) -> _Collected:
    """Per kind: its number of rows, the sum of their ``n``, and its first rows
    (``sample`` for findings, every figure row but the longest lists' tails)."""
    limit = (
        f"CASE WHEN kind = 'figure:backlog' THEN {BACKLOG_ROWS} "
        f"WHEN kind = 'figure:dead_error' THEN {DEAD_LETTER_ROWS} "
        f"WHEN startswith(kind, 'figure:') THEN {2**31 - 1} "
        "WHEN startswith(kind, 'count:') THEN 1 "
        f"ELSE {int(sample)} END"
    )
    ranked = everything.selectExpr(
        "kind",
        "row",
        "row_number() OVER (PARTITION BY kind ORDER BY sort) AS `rank`",
        "count(1) OVER (PARTITION BY kind) AS total",
        "sum(n) OVER (PARTITION BY kind) AS `sum`",
    ).where(f"`rank` <= {limit}")
    out: dict[str, tuple[int, int, list[tuple[int, dict[str, Any]]]]] = {}
    for r in ranked.collect():
        _, _, rows = out.setdefault(r["kind"], (int(r["total"]), int(r["sum"] or 0), []))
        rows.append((int(r["rank"]), json.loads(r["row"])))
    return {
        k: (total, summed, [row for _, row in sorted(rows, key=lambda p: p[0])])
        for k, (total, summed, rows) in out.items()
    }


def _first(rows: _Collected, kind: str) -> dict[str, Any]:
    found = _kept(rows, kind)
    return found[0] if found else {}


def _kept(rows: _Collected, kind: str) -> list[dict[str, Any]]:
    return rows.get(kind, (0, 0, []))[2]


def _pct(row: dict[str, Any], name: str) -> dict[str, Any]:
    pct = row.get("pct") or [None] * len(audit.PERCENTILES)
    return {
        "p50": pct[0],
        "p90": pct[1],
        "p99": pct[2],
        "max": row.get("max"),
    }


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _summary(
    rows: _Collected,
    config: AuditConfig,
    expected_documents: int | None,
    source: dict[str, Any] | None,
    reconciled: bool,
    dead: DataFrame | None,
) -> dict[str, Any]:
    documents = _first(rows, "figure:documents")
    read = int(documents.get("n") or 0)
    counts: dict[str, int] = {}
    found: dict[str, list[dict[str, Any]]] = {}
    for kind, (total, _, kept) in rows.items():
        if not kind.startswith(("figure:", "count:")):
            counts[kind] = total
            found[kind] = [_plain(r) for r in kept]
    if expected_documents is not None and read < expected_documents:
        counts["unread_documents"] = 1
        found["unread_documents"] = [
            {"expected": expected_documents, "read": read, "missing": expected_documents - read}
        ]
    partitions = _partitions(_kept(rows, "figure:partition"), config.partitions)
    pending_total = sum(p["pending"] for p in partitions)
    skewed = (
        [p for p in partitions if p["ratio"] > config.skew_ratio]
        if pending_total >= config.skew_min_pending
        else []
    )
    counts["partition_skew"] = len(skewed)
    found["partition_skew"] = skewed[: config.sample]
    sizes = {k: _integral(v) for k, v in _pct(documents, "size").items()}
    size_figures: dict[str, Any] = {
        "documents": read,
        **sizes,
        "exact": documents.get("xmin"),
    }
    for store, limit in (("mongodb", audit.MONGODB_LIMIT), ("cosmos", audit.COSMOS_LIMIT)):
        for p in ("p50", "p90", "p99", "max"):
            value = sizes[p]
            size_figures[f"headroom_{store}_{p}"] = None if value is None else 1 - value / limit
    inbox = _first(rows, "figure:inbox")
    ages = _first(rows, "figure:ages")
    summary: dict[str, Any] = {
        "generated_at": _plain(config.now),
        "source": source or {},
        "config": {
            "sla_seconds": config.sla_seconds,
            "window": config.window,
            "above_limit": config.above_limit,
            "size_limit": config.size_limit,
            "size_fraction": config.size_fraction,
            "partitions": config.partitions,
            "skew_ratio": config.skew_ratio,
        },
        "totals": {
            "documents": read,
            "pending_entries": int(documents.get("pending") or 0),
            "documents_with_pending": int(documents.get("flag") or 0),
            "expected_documents": expected_documents,
        },
        "backlog": [
            {
                "type": r["k1"],
                "destination": r["k2"],
                "pending": r["n"],
                "oldest": _instant(r["tmin"]),
            }
            for r in _kept(rows, "figure:backlog")
        ],
        "ages": {"pending": int(ages.get("values") or 0), **_pct(ages, "age")},
        "sizes": size_figures,
        "size_histogram": sorted(
            (
                {"bucket": int(r["k1"]), "documents": r["n"]}
                for r in _kept(rows, "figure:histogram")
            ),
            key=lambda r: r["bucket"],
        ),
        "inbox_fill": {
            **{k: _integral(v) for k, v in _pct(inbox, "inbox").items()},
            "full": int(inbox.get("flag") or 0),
        },
        "partitions": partitions,
    }
    if dead is not None:
        summary["dead_letters"] = [
            {"error": r["k1"], "count": r["n"], "latest": _instant(r["tmax"])}
            for r in _kept(rows, "figure:dead_error")
        ]
    if reconciled:
        summary["consumer_totals"] = {
            "documents": int(_first(rows, "figure:consumer_documents").get("n") or 0)
        }
        summary["reconciliation"] = _reconciliation(rows, counts)
    summary["findings"] = {
        kind: {"count": counts.get(kind, 0), "threshold": config.thresholds.get(kind)}
        for kind in config.thresholds
    }
    summary["rows"] = {kind: found.get(kind, []) for kind in config.thresholds}
    summary["failed"] = failures(summary)
    return summary


def _partitions(rows: list[dict[str, Any]], declared: int | None) -> list[dict[str, Any]]:
    """Documents and pending entries per dispatcher partition (every declared partition,
    documents or not), each partition's pending entries as a multiple of the mean."""
    seen = {int(r["k1"]): r for r in rows}
    numbers = sorted(set(seen) | set(range(declared or 0)))
    count = declared or len(seen)
    total = sum(int(r["pending"] or 0) for r in seen.values())
    mean = total / count if count else 0.0
    out = []
    for number in numbers:
        r = seen.get(number, {})
        pending = int(r.get("pending") or 0)
        out.append(
            {
                "partition": number,
                "documents": int(r.get("n") or 0),
                "pending": pending,
                "ratio": pending / mean if mean > 0 else 0.0,
            }
        )
    return out


def _reconciliation(rows: _Collected, counts: dict[str, int]) -> dict[str, Any]:
    """How the producers' emitted messages were accounted for."""
    by = {r["k1"]: int(r["n"] or 0) for r in _kept(rows, "figure:reconciliation")}
    by_marks = by.get("marks", 0)
    by_window = rows.get("count:id_window", (0, 0, []))[1]
    pending = by.get("pending", 0)
    dead = by.get("dead_letter", 0)
    return {
        "emitted": by.get("emitted", 0),
        "reconciled": by_marks + by_window + pending + dead,
        "by_exact_marks": by_marks,
        "by_id_window": by_window,
        "pending": pending,
        "dead_letters": dead,
        "lost": by.get("lost", 0),
        "duplicated": by.get("duplicated", 0),
        "unexpected": by.get("unexpected", 0),
        "unverifiable": counts.get("unverifiable", 0),
    }


def failures(summary: dict[str, Any]) -> list[str]:
    """The finding kinds whose count is above their threshold."""
    out = []
    for kind, f in summary["findings"].items():
        if f["threshold"] is not None and f["count"] > f["threshold"]:
            out.append(kind)
    return out
