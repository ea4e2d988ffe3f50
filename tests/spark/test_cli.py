"""``docoutbox export`` and ``docoutbox audit`` end to end, and the HTML report rendered in
headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkRuntimeError

import docoutbox_spark.readers
from docoutbox_app.cli import main
from docoutbox_spark.report import BAD, BAR, GOOD, write_html
from tests.conftest import missing
from tests.spark import planted
from tests.spark.conftest import JARS
from tests.spark.png import hex_rgb, pixels

PLANTED_ARGS = [
    "--now",
    planted.NOW.isoformat(),
    "--sla",
    str(planted.SLA),
    "--window",
    str(planted.WINDOW),
    "--above-limit",
    str(planted.ABOVE_LIMIT),
    "--partitions",
    str(planted.PARTITIONS),
    "--skew-min-pending",
    "10",
    "--progress-interval",
    "1",
]


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--db", "x"]) == 2
    assert "--collection are required" in capsys.readouterr().err
    assert main(["audit", "--from-parquet", "/nonexistent/dir"]) == 2
    assert main(["audit", "--from-parquet", ".", "--threshold", "stuck=many"]) == 2


@pytest.mark.parametrize(
    "bad",
    [
        ["--sla", "nan"],
        ["--sla", "-1"],
        ["--window", "0"],
        ["--size-fraction", "2"],
        ["--partitions", "0"],  # a ZeroDivisionError-free audit of nonsense
        ["--skew-ratio", "nan"],
        ["--skew-min-pending", "-3"],
        ["--progress-interval", "nan"],
        ["--read-partitions", "0"],
        ["--report", "/nonexistent/dir/audit.html"],  # failed after the whole audit
        ["--json", "."],
        # Each was a Java gateway or Py4J traceback once Spark tried to start.
        ["--driver-memory", "1gb"],
        ["--driver-memory", "100m"],
        ["--driver-memory", "lots"],
        ["--driver-memory", "2048"],  # bytes to the JVM's -Xmx
        ["--spark-master", "bogus"],
        ["--spark-master", "local[0]"],
    ],
)
def test_bad_audit_options_exit_2_before_spark_starts(
    bad: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "producer").mkdir()
    assert main(["audit", "--from-parquet", str(tmp_path), *bad]) == 2
    assert bad[0] in capsys.readouterr().err


def test_spark_that_cannot_start_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No Java, or a JVM that refuses its options: was a PySparkRuntimeError traceback.

    def no_gateway(**_: Any) -> Any:
        raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})

    monkeypatch.setattr(docoutbox_spark.readers, "session", no_gateway)
    (tmp_path / "producer").mkdir()
    assert main(["audit", "--from-parquet", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "docoutbox: error: cannot start Spark: [JAVA_GATEWAY_EXITED]" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("jars", ["missing", "empty", "listed"])
def test_connector_jars_that_do_not_exist_exit_2_before_spark_starts(
    jars: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Spark only warned, then could not find the connector (or fetched it from Maven).
    (tmp_path / "empty").mkdir()
    (tmp_path / "real.jar").write_bytes(b"")
    given, named = {
        "missing": (str(tmp_path / "missing"), "missing"),
        "empty": (str(tmp_path / "empty"), "holds no .jar"),
        "listed": (f"{tmp_path / 'real.jar'},https://repo/x.jar,{tmp_path / 'gone.jar'}", "gone"),
    }[jars]
    args = ["export", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    assert main([*args, "--out", str(tmp_path / "out"), "--spark-jars", given]) == 2
    err = capsys.readouterr().err
    assert "--spark-jars" in err and named in err


@pytest.mark.parametrize("out", ["file", "missing/deeper"])
def test_export_to_an_unusable_directory_exits_2_before_spark_starts(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory")
    args = ["export", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    assert (
        main(
            [*args, "--out", str(tmp_path / "missing" / "deeper" if "/" in out else tmp_path / out)]
        )
        == 2
    )
    assert "--out" in capsys.readouterr().err


@pytest.fixture(scope="module")
def audited(
    spark: Any, planted_db: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    uri, db = planted_db
    out = tmp_path_factory.mktemp("audit")
    snap = out / "snapshot"
    common = ["--mongo-uri", uri, "--db", db, "--spark-jars", str(JARS)]
    code = main(
        [
            "export",
            *common,
            "--collection",
            "producer",
            "--consumer-collection",
            "consumer",
            "--dead-letters",
            "dead",
            "--reader",
            "datasource",
            "--out",
            str(snap),
        ]
    )
    assert code == 0
    manifest = json.loads((snap / "manifest.json").read_text())
    assert manifest["counts"]["producer"] == manifest["collection_counts"]["producer"]
    html, summary = out / "audit.html", out / "audit.json"
    code = main(
        [
            "audit",
            "--from-parquet",
            str(snap),
            "--report",
            str(html),
            "--json",
            str(summary),
            *PLANTED_ARGS,
        ]
    )
    return {"code": code, "html": html, "summary": json.loads(summary.read_text()), "dir": out}


def test_audit_of_a_parquet_snapshot_finds_the_planted_anomalies(audited: dict[str, Any]) -> None:
    assert audited["code"] == 3  # findings above their thresholds
    assert planted.reported(audited["summary"]) == planted.EXPECTED


def test_thresholds_decide_the_exit_code(audited: dict[str, Any]) -> None:
    snap = audited["dir"] / "snapshot"
    relaxed = [f"--threshold={k}=none" for k in planted.EXPECTED]
    assert main(["audit", "--from-parquet", str(snap), *PLANTED_ARGS, *relaxed]) == 0


def test_unreachable_server_exits_1(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    uri = "mongodb://user:secret@127.0.0.1:9/?serverSelectionTimeoutMS=300"
    code = main(
        [
            "audit",
            "--mongo-uri",
            uri,
            "--db",
            "d",
            "--collection",
            "c",
            "--spark-jars",
            str(JARS),
            "--progress-interval",
            "0",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and "secret" not in err


def screenshot(html: Path, png: Path) -> tuple[int, int, Any]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        missing("chromium not installed; run scripts/servers.sh install-chromium")
    assert browser is not None
    profile = png.parent / f"profile-{png.stem}"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-extensions",
            "--no-first-run",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            "--window-size=1000,1400",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return pixels(png)


def test_report_renders_its_charts_offline_in_chromium(audited: dict[str, Any]) -> None:
    html: Path = audited["html"]
    text = html.read_text()
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    assert "https://" not in text
    width, height, counts = screenshot(html, html.with_suffix(".png"))
    assert (width, height) == (1000, 1400)
    # Bars of the charts (blue), the failed kinds and the FAILED banner (red) were drawn.
    assert counts[hex_rgb(BAR)] > 2000
    assert counts[hex_rgb(BAD)] > 2000
    assert counts[hex_rgb(GOOD)] < 50


def test_a_clean_report_draws_no_failure(tmp_path: Path) -> None:
    summary = {
        "findings": {k: {"count": 0, "threshold": 0} for k in planted.EXPECTED},
        "failed": [],
        "rows": {},
        "totals": {"documents": 3, "pending_entries": 2},
        "backlog": [{"type": "Credited", "destination": "ledger", "pending": 2}],
        "ages": {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0},
        "size_histogram": [{"bucket": 0, "documents": 3}],
        "partitions": [{"partition": 0, "pending": 2}],
        "config": {"size_limit": 16 * 1024 * 1024},
    }
    html = tmp_path / "clean.html"
    write_html(summary, html)
    _, _, counts = screenshot(html, tmp_path / "clean.png")
    assert counts[hex_rgb(BAD)] == 0
    assert counts[hex_rgb(GOOD)] > 1000  # the PASSED banner and the zero-count kinds
    assert counts[hex_rgb(BAR)] > 500
