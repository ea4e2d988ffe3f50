"""Ending the Spark tests' session leaves nothing running: no py4j thread (which would
sleep inside the unit tier that runs next) and no JVM, and a later session starts afresh.
The audit command ends the same way a session it made, and leaves one it was handed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from docoutbox_spark.readers import write_snapshot
from tests.conftest import missing
from tests.spark import planted
from tests.spark.conftest import spark_missing
from tests.spark.test_audit import frame

ROOT = Path(__file__).resolve().parents[2]

# Runs in a child process: the test process's own session is shared by the Spark tests.
CHILD = """
import json, threading
from pyspark import SparkContext
from docoutbox_spark.readers import session
from tests.support.spark import end_session

counts, jvms, left = [], [], []
for _ in range(2):
    spark = session(packages=False)
    counts.append(spark.range(3).count())
    jvm = SparkContext._gateway.proc
    end_session(spark)
    jvms.append(jvm.poll())
    left.append([t.name for t in threading.enumerate() if t is not threading.main_thread()])
print(json.dumps({"counts": counts, "jvm_exit_codes": jvms, "threads_left": left}))
"""


def test_an_ended_session_leaves_no_thread_and_no_jvm_and_a_new_one_starts() -> None:
    reason = spark_missing()
    if reason:
        missing(reason)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"counts": [3, 3], "jvm_exit_codes": [0, 0], "threads_left": [[], []]}


# The command in a child process, first with no session (it makes one and ends it with its
# gateway), then handed a session, which it leaves running.
COMMAND = """
import json, sys, threading
from pyspark import SparkContext
from docoutbox_app.cli import main
from docoutbox_spark.readers import end_session, session

def others():
    return [t.name for t in threading.enumerate() if t is not threading.main_thread()]

codes = [main(["audit", "--from-parquet", sys.argv[1]])]
made = {"gateway": SparkContext._gateway is not None, "threads": others()}
handed = session(packages=False)
codes.append(main(["audit", "--from-parquet", sys.argv[1]]))
kept = {"gateway": SparkContext._gateway is not None, "count": handed.range(3).count()}
left = end_session(handed)
print(json.dumps({"codes": codes, "made": made, "kept": kept, "left": left}))
"""


def test_the_audit_command_ends_the_gateway_of_a_session_it_made_only(
    spark: Any, tmp_path: Path
) -> None:
    write_snapshot({"producer": frame(spark, [planted.doc("w-ok", 0, [], 0)])}, tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", COMMAND, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "codes": [0, 0],
        "made": {"gateway": False, "threads": []},
        "kept": {"gateway": True, "count": 3},
        "left": [],
    }
