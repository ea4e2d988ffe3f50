"""The same audit on a Spark standalone cluster (``scripts/servers.sh start-spark-cluster``:
a master and two workers on 127.0.0.1) as on ``local``: the connector's jars and the
project's Python data sources are shipped to the executors, and the findings are the same
for the connector, the pymongo data source and a Parquet snapshot (the typed layout the
export writes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from docoutbox_app.cli import main
from docoutbox_spark.readers import is_typed_snapshot
from tests.conftest import missing
from tests.spark import planted
from tests.spark.conftest import JARS
from tests.spark.test_cli import PLANTED_ARGS

MASTER = os.environ.get("DOCOUTBOX_SPARK_MASTER", "spark://127.0.0.1:17077")
ROOT = Path(__file__).resolve().parents[2]

# Runs in a child process: a driver of its own (one SparkContext per process) on the
# cluster, auditing each source in turn through the command.
CHILD = """
import json, sys
from docoutbox_app.cli import main
from docoutbox_spark.readers import session

master, jars, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spark = session(master=master, jars=jars, packages=False, memory="512m",
                extra={"spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1",
                       "spark.cores.max": "2"})
codes = [main(args) for args in runs]
print("codes", json.dumps(codes), flush=True)
# The block managers of the driver and of each executor that ran.
print("executors", spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1)
spark.stop()
"""


def _master_answers() -> str | None:
    host, _, port = MASTER.removeprefix("spark://").partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return None
    except OSError as exc:
        return f"no Spark master at {MASTER} ({exc}); run scripts/servers.sh start-spark-cluster"


def _findings(path: Path) -> dict[str, Any]:
    summary = json.loads(path.read_text())
    return {k: summary[k] for k in ("findings", "rows", "totals", "failed", "reconciliation")}


def test_the_cluster_finds_what_local_finds(spark: Any, planted_db: Any, tmp_path: Path) -> None:
    reason = _master_answers()
    if reason:
        missing(reason)
    uri, db = planted_db
    snapshot = tmp_path / "snapshot"
    mongo = ["--mongo-uri", uri, "--db", db, "--collection", "producer"]
    both = [*mongo, "--consumer-collection", "consumer", "--dead-letters", "dead"]
    assert main(["export", *both, "--reader", "datasource", "--out", str(snapshot)]) == 0
    assert is_typed_snapshot(snapshot / "producer") and is_typed_snapshot(snapshot / "consumer")
    sources = {
        "connector": [*both, "--reader", "connector", "--spark-jars", str(JARS)],
        "datasource": [*both, "--reader", "datasource"],
        "parquet": ["--from-parquet", str(snapshot)],
    }

    def run(where: str, name: str) -> list[str]:
        return [
            "audit",
            *sources[name],
            *PLANTED_ARGS,
            "--progress-interval",
            "0",
            "--json",
            str(tmp_path / f"{where}-{name}.json"),
        ]

    for name in sources:
        assert main(run("local", name)) == 3
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            MASTER,
            str(JARS),
            json.dumps([run("cluster", name) for name in sources]),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "executors 2" in child.stdout, child.stdout
    assert "codes [3, 3, 3]" in child.stdout, child.stdout + child.stderr[-3000:]
    # A fresh driver without --verbose: none of Spark's own log lines or progress bars.
    assert " WARN " not in child.stderr and "[Stage " not in child.stderr, child.stderr[-3000:]
    assert "Setting default log level" not in child.stderr, child.stderr[-3000:]
    for name in sources:
        local = _findings(tmp_path / f"local-{name}.json")
        assert _findings(tmp_path / f"cluster-{name}.json") == local, name
        assert planted.reported(local) == planted.EXPECTED
