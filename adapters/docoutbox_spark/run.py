"""Run every audit over the frames and collect a JSON-ready summary with its findings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from docoutbox_spark import audit
from docoutbox_spark.conform import conform, conform_dead_letters

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
    "retrying": None,
    "dead_letter": None,
    "inbox_window_full": None,
    "partition_skew": None,
}


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


def _rows(frame: DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    rows = frame.limit(limit).collect() if limit is not None else frame.collect()
    return [_plain(r.asDict(recursive=True)) for r in rows]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC).isoformat() if value.tzinfo is None else value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _one(frame: DataFrame) -> dict[str, Any]:
    rows = _rows(frame)
    return rows[0] if rows else {}


class Findings:
    def __init__(self, sample: int) -> None:
        self.sample = sample
        self.counts: dict[str, int] = {}
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, kind: str, frame: DataFrame, where: Any = None) -> None:
        if where is not None:
            frame = frame.where(where)
        rows = _rows(frame, self.sample + 1)
        count = len(rows) if len(rows) <= self.sample else int(frame.count())
        self.counts[kind] = self.counts.get(kind, 0) + count
        self.rows.setdefault(kind, []).extend(rows[: self.sample])

    def split(self, frame: DataFrame, column: str, kinds: dict[str, str]) -> None:
        """Add the rows of ``frame`` to the kind named by their ``column`` value."""
        rows = _rows(frame, self.sample + 1)
        exact = len(rows) <= self.sample
        counts: dict[str, int] = {}
        if not exact:
            counts = {
                r[column]: r["n"]
                for r in _rows(frame.groupBy(column).agg(F.count(F.lit(1)).alias("n")))
            }
        for value, kind in kinds.items():
            mine = [r for r in rows if r[column] == value]
            self.counts[kind] = self.counts.get(kind, 0) + (
                len(mine) if exact else counts.get(value, 0)
            )
            self.rows.setdefault(kind, []).extend(mine[: self.sample])

    def add_rows(self, kind: str, rows: list[dict[str, Any]]) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + len(rows)
        self.rows.setdefault(kind, []).extend(rows[: self.sample])


def run_audit(
    producer: DataFrame,
    *,
    consumer: DataFrame | None = None,
    dead_letters: DataFrame | None = None,
    expected_documents: int | None = None,
    config: AuditConfig | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Audit raw frames; return the summary (JSON-ready) with findings and figures."""
    config = config or AuditConfig()
    cached = [producer.cache()]
    produced = conform(producer)
    docs = produced.documents
    entries = produced.entries
    findings = Findings(config.sample)
    read = int(docs.count())
    if expected_documents is not None and read < expected_documents:
        findings.add_rows(
            "unread_documents",
            [{"expected": expected_documents, "read": read, "missing": expected_documents - read}],
        )
    findings.add("malformed", produced.malformed)
    totals = _one(
        docs.agg(
            F.count(F.lit(1)).alias("documents"),
            F.sum("pending").alias("pending_entries"),
            F.sum(F.when(F.col("pending") > 0, 1).otherwise(0)).alias("documents_with_pending"),
        )
    )
    stuck = audit.stuck(entries, config.now, config.sla_seconds)
    findings.add("stuck", stuck)
    findings.add("retrying", audit.retries(entries))
    findings.split(
        audit.seq_anomalies(entries),
        "kind",
        {"seq_gap": "seq_gap", "seq_duplicate": "seq_duplicate"},
    )
    findings.add("outbox_seq_behind", audit.outbox_seq_behind(docs, entries))
    findings.add("duplicate_entry_id", audit.duplicate_entry_ids(entries))
    saturation = audit.inbox_saturation(docs, config.window, config.above_limit)
    findings.split(saturation, "kind", {"window": "inbox_window_full", "above": "inbox_above"})
    findings.add(
        "near_size_limit", audit.near_size_limit(docs, config.size_limit, config.size_fraction)
    )
    skew = _rows(audit.partition_skew(docs, config.partitions))
    pending_total = sum(int(r["pending"] or 0) for r in skew)
    if pending_total >= config.skew_min_pending:
        findings.add_rows(
            "partition_skew", [r for r in skew if (r["ratio"] or 0) > config.skew_ratio]
        )
    else:
        findings.add_rows("partition_skew", [])
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
        "totals": {**totals, "expected_documents": expected_documents},
        "backlog": _rows(audit.backlog(entries), 500),
        "ages": _one(audit.age_percentiles(entries, config.now)),
        "sizes": _one(audit.document_sizes(docs)),
        "size_histogram": _rows(audit.size_histogram(docs, config.size_limit)),
        "inbox_fill": _one(audit.inbox_fill(docs, config.window)),
        "partitions": skew,
    }
    if dead_letters is not None:
        cached.append(dead_letters.cache())
        dead = conform_dead_letters(dead_letters)
        by_error = _rows(audit.dead_letters_by_error(dead), 200)
        summary["dead_letters"] = by_error
        findings.add("dead_letter", dead.select("id", "aggregate_id", "entry_id", "error"))
    else:
        dead = None
    if consumer is not None:
        cached.append(consumer.cache())
        consumed = conform(consumer)
        cdocs = consumed.documents
        findings.add(
            "malformed", consumed.malformed.withColumn("kind", F.lit("malformed_consumer"))
        )
        rec = audit.reconcile(docs, entries, cdocs, dead)
        findings.split(rec, "status", {s: s for s in ("lost", "duplicated", "unexpected")})
        ids = audit.reconcile_ids(cdocs)
        findings.add("duplicated", ids.select(F.col("id").alias("entry_id"), "status", "consumers"))
        summary["consumer_totals"] = _one(cdocs.agg(F.count(F.lit(1)).alias("documents")))
    summary["findings"] = {
        kind: {"count": findings.counts.get(kind, 0), "threshold": config.thresholds.get(kind)}
        for kind in config.thresholds
    }
    summary["rows"] = findings.rows
    summary["failed"] = failures(summary)
    for frame in cached:
        frame.unpersist()
    return summary


def failures(summary: dict[str, Any]) -> list[str]:
    """The finding kinds whose count is above their threshold."""
    out = []
    for kind, f in summary["findings"].items():
        if f["threshold"] is not None and f["count"] > f["threshold"]:
            out.append(kind)
    return out
