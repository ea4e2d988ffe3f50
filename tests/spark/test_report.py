"""The HTML report's content, from summaries written by hand (no Spark), and how the
command starts Spark for each reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkRuntimeError

import docoutbox_spark.readers
from docoutbox_app.cli import main
from docoutbox_spark.readers import CONNECTOR, session_config
from docoutbox_spark.report import render_html
from tests.spark import planted


def summary(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "generated_at": planted.NOW.isoformat(),
        "source": {"db": "bank", "collection": "accounts", "reader": "datasource"},
        "findings": {k: {"count": 0, "threshold": 0} for k in planted.EXPECTED},
        "failed": [],
        "rows": {},
        "totals": {"documents": 3, "pending_entries": 0, "expected_documents": 3},
        "backlog": [],
        "ages": {"pending": 0, "p50": None, "p90": None, "p99": None, "max": None},
        "sizes": {"max": 503, "headroom_mongodb_max": 0.99997, "headroom_cosmos_max": 0.9998},
        "size_histogram": [{"bucket": 0, "documents": 3}],
        "partitions": [
            {"partition": 0, "documents": 3, "pending": 0, "ratio": 0.0},
            {"partition": 1, "documents": 0, "pending": 0, "ratio": 0.0},
        ],
        "config": {"size_limit": 16 * 1024 * 1024},
    }
    base.update(changes)
    return base


def test_a_duplicated_message_id_keeps_its_column_after_a_duplicated_seq() -> None:
    rows = [
        {"source": "Wallet/w", "seq": 2, "status": "duplicated", "consumers": ["c-1", "c-2"]},
        {"entry_id": "m-dup", "status": "duplicated", "consumers": ["c-1", "c-3"]},
    ]
    findings = {k: {"count": 0, "threshold": 0} for k in planted.EXPECTED}
    findings["duplicated"] = {"count": 2, "threshold": 0}
    html = render_html(summary(findings=findings, rows={"duplicated": rows}, failed=["duplicated"]))
    table = html[html.index("<h3>duplicated") :]
    assert "<th>entry_id</th>" in table
    assert "<td>m-dup</td>" in table
    assert "<td>Wallet/w</td>" in table


def test_the_header_names_the_source_in_words_not_as_a_json_dict() -> None:
    html = render_html(summary())
    head = html[: html.index("<div class='grid'>")]
    assert "{&quot;" not in head and '{"' not in head
    assert "<th>collection</th><td>accounts</td>" in head


def test_headroom_is_never_rounded_to_the_whole_limit() -> None:
    html = render_html(summary())
    assert "99.997%" in html
    assert "99.98%" in html
    assert "<td>1</td>" not in html


def test_ages_without_pending_entries_are_not_zero_seconds() -> None:
    html = render_html(summary())
    assert "0 s<" not in html
    assert "no pending entry has a date" in html


def test_partitions_with_no_documents_are_shown() -> None:
    assert "partition 1 (no documents)" in render_html(summary())


def test_expected_documents_and_reconciliation_are_explained() -> None:
    rec = {
        "emitted": 5,
        "reconciled": 4,
        "by_exact_marks": 0,
        "by_id_window": 4,
        "pending": 0,
        "dead_letters": 0,
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
        "unverifiable": 1,
    }
    html = render_html(summary(reconciliation=rec))
    assert "counted by the database apart from Spark" in html
    assert "4 of 5 emitted messages reconciled" in html
    assert "1 could not be verified" in html


@pytest.mark.parametrize(
    "args",
    [
        [
            "--mongo-uri",
            "mongodb://127.0.0.1:1/",
            "--db",
            "d",
            "--collection",
            "c",
            "--reader",
            "datasource",
        ],
        [
            "--cosmos-endpoint",
            "http://127.0.0.1:1/",
            "--cosmos-key",
            "k",
            "--database",
            "d",
            "--container",
            "c",
        ],
        ["--from-parquet", "PARQUET"],
    ],
    ids=["datasource", "cosmos", "parquet"],
)
def test_readers_other_than_the_connector_resolve_no_maven_package(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    asked: dict[str, Any] = {}

    def record(**kwargs: Any) -> Any:
        asked.update(kwargs)
        raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})

    monkeypatch.setattr(docoutbox_spark.readers, "session", record)
    (tmp_path / "producer").mkdir()
    given = [str(tmp_path) if a == "PARQUET" else a for a in args]
    assert main(["audit", *given, "--spark-jars", str(tmp_path)]) == 1
    assert asked["packages"] is False and asked["jars"] is None
    config = session_config(jars=asked["jars"], packages=asked["packages"])
    assert "spark.jars.packages" not in config and "spark.jars" not in config


def test_the_connector_alone_resolves_its_package() -> None:
    assert session_config(packages=True)["spark.jars.packages"] == CONNECTOR


def test_spark_logs_and_progress_bar_only_when_verbose() -> None:
    quiet, verbose = session_config(), session_config(verbose=True)
    assert quiet["spark.ui.showConsoleProgress"] == "false"
    assert "log4j2-quiet.properties" in quiet["spark.driver.extraJavaOptions"]
    assert verbose["spark.ui.showConsoleProgress"] == "true"
    assert "spark.driver.extraJavaOptions" not in verbose
    assert "spark.sql.shuffle.partitions" not in quiet
