"""What the audit reports beyond the planted collections: consumer-side saturation,
timestamps in UTC whatever the time zone, reconciliation of consumers that keep an ID
window, and how many Spark jobs an audit takes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from docoutbox.store.plans import entry_id
from docoutbox_app.cli import main
from docoutbox_spark.readers import write_snapshot
from docoutbox_spark.run import AuditConfig, run_audit
from docoutbox_spark.schema import RAW_DEAD_LETTER_SCHEMA
from tests.spark import planted
from tests.spark.jobs import counting_jobs, counting_jvm_calls
from tests.spark.test_audit import config, frame


def test_consumer_side_saturation_is_reported(spark: Any) -> None:
    summary = run_audit(
        frame(spark, planted.producer(big=False)),
        consumer=frame(spark, planted.consumer()),
        config=config(),
    )
    full = {r["aggregate_id"]: r["collection"] for r in summary["rows"]["inbox_window_full"]}
    above = {
        (r["aggregate_id"], r["source"]): r["collection"] for r in summary["rows"]["inbox_above"]
    }
    assert full == {"w-window": "producer", "c-sat": "consumer"}
    assert above == {("w-above", "Other/x"): "producer", ("c-sat", "Other/y"): "consumer"}
    assert "inbox_above" in summary["failed"]


@pytest.fixture
def kolkata(spark: Any) -> Iterator[None]:
    """The machine and the Spark session in Asia/Kolkata (UTC+5:30)."""
    before_tz = os.environ.get("TZ")
    before_session = spark.conf.get("spark.sql.session.timeZone")
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        yield
    finally:
        if before_tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before_tz
        time.tzset()
        spark.conf.set("spark.sql.session.timeZone", before_session)


def test_timestamps_are_utc_whatever_the_time_zone(spark: Any, kolkata: None) -> None:
    docs = [planted.doc("a", 1, [planted.entry("a", 1, age=50)], 0)]
    dead = planted.dead_letters()[:1]  # quarantined 60 s before NOW
    summary = run_audit(
        frame(spark, docs),
        dead_letters=frame(spark, dead, RAW_DEAD_LETTER_SCHEMA),
        config=config(),
    )
    assert summary["backlog"][0]["oldest"] == (planted.NOW - timedelta(seconds=50)).isoformat()
    assert summary["dead_letters"][0]["latest"] == (planted.NOW - timedelta(seconds=60)).isoformat()
    assert summary["generated_at"] == planted.NOW.isoformat()
    assert summary["ages"]["max"] == pytest.approx(50.0)


def _window_mode(lost: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Producers whose consumers keep an ID window (no exact marks): ``Wallet/a`` seq 1
    has left its consumer's window; the others are still in it. With ``lost``, a stream
    whose consumer keeps exact marks misses its seq 2."""
    producers = [planted.doc("a", 3, [], 0), planted.doc("b", 2, [], 1)]

    def held(agg: str, *seqs: int) -> list[str]:
        return [entry_id("Wallet", agg, s) for s in seqs]

    consumers = [
        planted.doc("c-a", 0, [], 0, type="Statement", inbox=held("a", 2, 3)),
        planted.doc("c-b", 0, [], 0, type="Statement", inbox=held("b", 1, 2)),
    ]
    if lost:
        producers.append(planted.doc("e", 2, [], 2))
        consumers.append(
            planted.doc(
                "c-e",
                0,
                [],
                0,
                type="Statement",
                inbox=[],
                inbox_marks=[planted.mark("Wallet/e", 1)],
            )
        )
    return producers, consumers


def test_window_mode_consumers_are_checked_by_id_not_reported_lost(spark: Any) -> None:
    producers, consumers = _window_mode(lost=True)
    summary = run_audit(frame(spark, producers), consumer=frame(spark, consumers), config=config())
    reported = planted.reported(summary)
    assert reported["lost"] == {("Wallet/e", 2)}  # exact mode still proves a loss
    assert reported["unverifiable"] == {("Wallet/a", 1)}
    assert reported["duplicated"] == set()
    assert summary["reconciliation"] == {
        "emitted": 7,
        "reconciled": 5,
        "by_exact_marks": 1,
        "by_id_window": 4,
        "pending": 0,
        "dead_letters": 0,
        "lost": 1,
        "duplicated": 0,
        "unexpected": 0,
        "unverifiable": 1,
    }
    assert summary["failed"] == ["lost"]


def test_a_window_mode_service_that_lost_nothing_passes_and_says_what_it_verified(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    producers, consumers = _window_mode(lost=False)
    write_snapshot(
        {"producer": frame(spark, producers), "consumer": frame(spark, consumers)}, tmp_path
    )
    out = tmp_path / "audit.json"
    code = main(
        [
            "audit",
            "--from-parquet",
            str(tmp_path),
            "--json",
            str(out),
            "--now",
            planted.NOW.isoformat(),
            "--progress-interval",
            "0",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads(out.read_text())
    assert summary["findings"]["lost"]["count"] == 0
    assert summary["findings"]["unverifiable"]["count"] == 1
    assert "4 of 5 emitted messages reconciled" in printed
    assert "4 by ID window" in printed
    assert "1 could not be verified" in printed
    assert "InboxPolicy(exact=True)" in printed


def test_a_two_source_audit_takes_at_most_six_spark_jobs(spark: Any) -> None:
    producer = frame(spark, planted.producer(big=False))
    consumer = frame(spark, planted.consumer())
    with counting_jobs(spark) as counted:
        run_audit(producer, consumer=consumer, config=config())
    assert counted.jobs <= 6


def test_an_audit_with_dead_letters_reads_its_three_sources_in_one_job(spark: Any) -> None:
    producer = frame(spark, planted.producer(big=False))
    consumer = frame(spark, planted.consumer())
    dead = frame(spark, planted.dead_letters(), RAW_DEAD_LETTER_SCHEMA)
    with counting_jobs(spark) as counted:
        run_audit(producer, consumer=consumer, dead_letters=dead, config=config())
    assert counted.jobs <= 6


def test_an_audit_builds_its_query_in_few_jvm_calls(spark: Any) -> None:
    """Every Column a driver builds is a call into the JVM, and at a few hundred
    microseconds each they were most of an audit's fixed cost: the audit's expressions
    are SQL text. Built from Column objects, this audit made about 6,500 calls; now about 1,400."""
    producer = frame(spark, planted.producer(big=False))
    consumer = frame(spark, planted.consumer())
    dead = frame(spark, planted.dead_letters(), RAW_DEAD_LETTER_SCHEMA)
    with counting_jvm_calls() as counted:
        run_audit(producer, consumer=consumer, dead_letters=dead, config=config())
    assert 0 < counted.calls <= 2_500


def test_the_audit_config_defaults_to_the_whole_check() -> None:
    assert AuditConfig().thresholds["unverifiable"] is None
    assert AuditConfig().thresholds["lost"] == 0


def test_declared_partitions_without_documents_are_listed(spark: Any) -> None:
    docs = [planted.doc("a", 1, [planted.entry("a", 1)], 3)]
    summary = run_audit(frame(spark, docs), config=config())
    assert [p["partition"] for p in summary["partitions"]] == list(range(planted.PARTITIONS))
    assert {p["partition"]: p["documents"] for p in summary["partitions"]} == {
        n: int(n == 3) for n in range(planted.PARTITIONS)
    }
