"""Ending the Spark tests' session leaves nothing running: no py4j thread (which would
sleep inside the unit tier that runs next) and no JVM, and a later session starts afresh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import missing
from tests.spark.conftest import spark_missing

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
