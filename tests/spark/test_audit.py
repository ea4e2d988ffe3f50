"""Each audit finds exactly what was planted: nothing missed, nothing invented."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest

from docoutbox_spark import audit
from docoutbox_spark.conform import conform
from docoutbox_spark.run import ENTRY_FIELDS, AuditConfig, ColumnsMismatch, _union, run_audit
from docoutbox_spark.schema import RAW_DEAD_LETTER_SCHEMA, RAW_DOCUMENT_SCHEMA, raw_row
from docoutbox_spark.sqltext import literal, name
from tests.spark import planted


def frame(spark: Any, docs: list[dict[str, Any]], schema: Any = RAW_DOCUMENT_SCHEMA) -> Any:
    return spark.createDataFrame([raw_row(d, schema) for d in docs], schema)


def config() -> AuditConfig:
    return AuditConfig(
        now=planted.NOW,
        sla_seconds=planted.SLA,
        window=planted.WINDOW,
        above_limit=planted.ABOVE_LIMIT,
        partitions=planted.PARTITIONS,
        skew_min_pending=10,
    )


@pytest.fixture(scope="module")
def summary(spark: Any) -> dict[str, Any]:
    return run_audit(
        frame(spark, planted.producer()),
        consumer=frame(spark, planted.consumer()),
        dead_letters=frame(spark, planted.dead_letters(), RAW_DEAD_LETTER_SCHEMA),
        expected_documents=len(planted.producer(big=False)) + 1,
        config=config(),
    )


@pytest.mark.parametrize("kind", sorted(planted.EXPECTED))
def test_finding_detected_exactly_where_planted(summary: dict[str, Any], kind: str) -> None:
    assert planted.reported(summary)[kind] == planted.EXPECTED[kind]
    assert summary["findings"][kind]["count"] == len(planted.EXPECTED[kind])


def test_malformed_documents_still_count(summary: dict[str, Any]) -> None:
    assert summary["totals"]["documents"] == len(planted.producer(big=False)) + 1
    details = {r["aggregate_id"]: r["detail"] for r in summary["rows"]["malformed"]}
    assert details["m-version"] == "version: not an integer"
    assert details["m-outbox"] == "outbox: not an array"
    assert details["m-outbox-obj"] == "outbox: not an array"
    assert details["m-missing"] == "type: missing; outbox_seq: missing"
    assert details["m-entry"] == "outbox[0]: payload: missing; seq: not a positive integer"


def test_failing_kinds_are_the_planted_ones(summary: dict[str, Any]) -> None:
    informational = {"retrying", "dead_letter", "inbox_window_full", "partition_skew"}
    assert set(summary["failed"]) == {k for k, v in planted.EXPECTED.items() if v} - informational


def test_unread_documents_are_reported(spark: Any) -> None:
    docs = planted.producer(big=False)
    result = run_audit(frame(spark, docs), expected_documents=len(docs) + 3, config=config())
    assert result["rows"]["unread_documents"] == [
        {"expected": len(docs) + 3, "read": len(docs), "missing": 3}
    ]
    assert "unread_documents" in result["failed"]


def test_backlog_by_type_and_destination(spark: Any) -> None:
    docs = [
        planted.doc(
            "a",
            3,
            [
                planted.entry("a", 1),
                planted.entry("a", 2, type="Debited"),
                planted.entry("a", 3, destination=None),
            ],
            0,
        ),
        planted.doc("b", 1, [planted.entry("b", 1, age=50)], 0),
    ]
    rows = {
        (r.type, r.destination): (r.pending, r.oldest)
        for r in audit.backlog(conform(frame(spark, docs)).entries).collect()
    }
    assert set(rows) == {
        ("Credited", "statements"),
        ("Debited", "statements"),
        ("Credited", "(default)"),
    }
    assert rows[("Credited", "statements")][0] == 2
    assert rows[("Credited", "statements")][1] == (planted.NOW - timedelta(seconds=50)).replace(
        tzinfo=None
    )


def test_age_percentiles(spark: Any) -> None:
    docs = [planted.doc("a", 10, [planted.entry("a", s, age=10.0 * s) for s in range(1, 11)], 0)]
    row = audit.age_percentiles(conform(frame(spark, docs)).entries, planted.NOW).collect()[0]
    assert row.pending == 10
    assert row.max == 100.0
    assert row.p50 == pytest.approx(55.0)
    assert row.p90 == pytest.approx(91.0)


def test_document_sizes_and_headroom(spark: Any) -> None:
    docs = [
        planted.doc(f"d{i}", 0, [], 0, state={"blob": "y" * (100_000 * i)}) for i in range(1, 6)
    ]
    row = audit.document_sizes(conform(frame(spark, docs)).documents).collect()[0]
    assert 500_000 < row.max < 501_000
    assert row.headroom_mongodb_max == pytest.approx(1 - row.max / audit.MONGODB_LIMIT)
    assert row.headroom_cosmos_max == pytest.approx(1 - row.max / audit.COSMOS_LIMIT)
    assert row.headroom_cosmos_p50 > row.headroom_cosmos_max
    near = audit.near_size_limit(conform(frame(spark, docs)).documents, audit.COSMOS_LIMIT, 0.2)
    assert sorted(r.aggregate_id for r in near.collect()) == ["d5"]


def test_reconcile_without_dead_letters_reports_the_quarantined_seq_as_lost(spark: Any) -> None:
    # The dead letter is what accounts for w-dead's seq 2: without it, it is lost.
    result = audit.reconcile(
        conform(frame(spark, planted.producer(big=False))).documents,
        conform(frame(spark, planted.consumer())).documents,
    )
    lost = {(r.source, r.seq) for r in result.where("status = 'lost'").collect()}
    assert lost == {("Wallet/w-lost", 4), ("Wallet/w-lost", 5), ("Wallet/w-dead", 2)}


def test_a_scheduled_entry_not_released_has_no_seq_and_is_no_finding(spark: Any) -> None:
    # Numbered when released: a pending scheduled entry has no seq, and no gap is left.
    waiting = {**planted.entry("s-1", 2, due=planted.NOW), "seq": None}
    released = planted.entry("s-1", 2, id="s-1-r", due=planted.NOW, released=True)
    docs = [
        planted.doc("s-1", 1, [planted.entry("s-1", 1), waiting], 0),
        planted.doc("s-2", 2, [planted.entry("s-2", 1), released], 1),
        planted.doc("s-3", 1, [{**waiting, "due": None}], 2),
    ]
    conformed = conform(frame(spark, docs))
    bad = {(r.aggregate_id, r.detail) for r in conformed.malformed.collect()}
    assert bad == {("s-3", "outbox[0]: seq: missing")}
    assert audit.seq_anomalies(conformed.documents).collect() == []


def test_a_scheduled_entry_waits_from_its_due_time(spark: Any) -> None:
    # Created two hours ago: one falls due in an hour (not stuck, whatever its age), one
    # fell due ten minutes ago (stuck for 600 s, not 7,200 s), one has no due time.
    later = {**planted.entry("t-1", 1, age=7200, due=planted.NOW + timedelta(hours=1))}
    overdue = {**planted.entry("t-2", 1, age=7200, due=planted.NOW - timedelta(minutes=10))}
    plain = planted.entry("t-3", 1, age=7200)
    docs = [
        planted.doc("t-1", 1, [{**later, "seq": None}], 0),
        planted.doc("t-2", 1, [{**overdue, "released": True}], 1),
        planted.doc("t-3", 1, [plain], 2),
    ]
    entries = conform(frame(spark, docs)).entries
    ages = {r.aggregate_id: r.age for r in audit.stuck(entries, planted.NOW, planted.SLA).collect()}
    assert ages == {"t-2": 600.0, "t-3": 7200.0}
    assert audit.age_percentiles(entries, planted.NOW).first()["pending"] == 2

    summary = run_audit(frame(spark, docs), config=config())
    assert {r["aggregate_id"] for r in summary["rows"]["stuck"]} == {"t-2", "t-3"}
    assert summary["ages"]["pending"] == 2
    assert summary["ages"]["max"] == 7200.0


def _streams(count: int) -> list[tuple[Any, ...]]:
    """Streams with at most one mark, of every shape: seqs covered by the ``hw``, by
    ``above`` or by both, pending, quarantined, lost, beyond the emitted ones, negative
    or absent bounds, duplicated pending seqs."""
    rng = random.Random(31)
    rows = []
    for i in range(count):
        emitted = rng.randint(-1, 12)
        pending = [rng.randint(1, 14) for _ in range(rng.randint(0, 4))]
        dead = [rng.randint(1, 14) for _ in range(rng.randint(0, 2))]
        marks = []
        if rng.random() < 0.8:
            above = [rng.randint(-1, 18) for _ in range(rng.randint(0, 4))]
            marks.append((f"c-{i}", rng.randint(-2, 16), above))
        rows.append((f"s-{i}", emitted, pending, dead, marks))
    return rows


def test_streams_with_one_mark_get_the_statuses_every_seq_would_get(spark: Any) -> None:
    # The usual stream (at most one mark) is reconciled from ranges and set operations;
    # it must agree with the status of every emitted seq, which handles any marks.
    schema = (
        "source string, emitted bigint, pending array<bigint>, dead array<bigint>, "
        "marks array<struct<consumer:string,hw:bigint,above:array<bigint>>>"
    )
    streams = spark.createDataFrame(_streams(600), schema)
    rows = (
        audit._with_mark_sets(streams, "emitted", "marks")
        .selectExpr(
            "source",
            f"{audit._one_mark('emitted', 'marks')} AS short",
            f"{audit._any_marks('emitted', 'marks')} AS every",
        )
        .collect()
    )
    assert len(rows) == 600
    differ = [r.source for r in rows if r.short != r.every]
    assert differ == []
    statuses = {i.status for r in rows for i in r.every.issues}
    assert statuses == {"lost", "candidate", "unexpected"}
    # Every status is met, and the counts account for every emitted seq once.
    kinds = ("marks", "pending", "dead_letter", "duplicated", "lost", "candidate")
    assert all(any(r.every.counts[k] for r in rows) for k in (*kinds[:3], *kinds[4:]))
    assert any(r.every.counts["unexpected"] for r in rows)
    emitted_of = {s[0]: s[1] for s in _streams(600)}
    for r in rows:
        assert sum(r.every.counts[k] for k in kinds) == max(emitted_of[r.source], 0)


def test_sql_text_quotes_any_literal_and_column_name(spark: Any) -> None:
    """The audit's expressions are SQL text: a literal or a column name holding quotes,
    backslashes or backticks reads back as it was."""
    odd = "it's a \\ `test` \\' with \"quotes\""
    row = spark.range(1).selectExpr(f"{literal(odd)} AS {name(odd)}").collect()[0]
    assert row[odd] == odd


def test_lean_entries_keep_only_the_fields_asked_for_and_the_same_rows(spark: Any) -> None:
    """``entry_fields``: the entries (persisted or not) keep those fields, ``position`` and
    ``problems``; the documents, entries and malformed rows are otherwise the same."""
    raw = frame(spark, planted.producer())
    whole = conform(raw)
    lean = conform(raw, entry_fields=ENTRY_FIELDS)
    fields = ["position", *ENTRY_FIELDS, "problems"]
    head = ["aggregate_id", "aggregate_type", "partition"]
    assert lean.entries.columns == head + fields
    assert sorted(lean.entries.collect()) == sorted(whole.entries.select(*head, *fields).collect())
    assert sorted(lean.malformed.collect()) == sorted(whole.malformed.collect())
    documents = whole.documents.columns
    assert sorted(lean.documents.select(*documents).collect()) == sorted(whole.documents.collect())


def test_union_refuses_frames_whose_columns_differ(spark: Any) -> None:
    """The audit's result frames are unioned by position: a frame whose columns differ
    from the first's (in name or order) is refused, never read into the wrong column."""
    first = spark.range(1).selectExpr("1 AS a", "2 AS b")
    assert _union([first, first.selectExpr("a", "b")]).collect() == [(1, 2), (1, 2)]
    with pytest.raises(ColumnsMismatch):
        _union([first, first.selectExpr("b", "a")])
