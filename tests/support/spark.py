"""Ending a Spark session so that nothing of it outlives the tier that used it.

``SparkSession.stop()`` stops the SparkContext but keeps the py4j gateway: its JVM and its
``FinalizerWorker`` thread, which polls a queue and sleeps a second whenever the queue is
empty. The unit tier runs after the Spark tier in the same pytest process and refuses a
sleep, so a worker left running is stopped there with an error naming it. :func:`end_session`
stops the session, shuts the gateway down, waits for the JVM and the worker to end, and
forgets the gateway, so that a later session starts a new one.

Import this module only where pyspark is installed (inside the Spark fixtures).
"""

from __future__ import annotations

import threading

from py4j.clientserver import FinalizerWorker
from pyspark import SparkContext
from pyspark.sql import SparkSession

#: How long the JVM and the finalizer worker may take to end (the worker sleeps 1 s).
ENDING_TIMEOUT = 60.0


def end_session(spark: SparkSession) -> None:
    """Stop ``spark`` and the py4j gateway it runs on: every thread and process it started
    has ended when this returns."""
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the JVM exits when its stdin ends
        proc.wait(timeout=ENDING_TIMEOUT)
    workers = [t for t in threading.enumerate() if isinstance(t, FinalizerWorker)]
    for worker in workers:
        worker.join(timeout=ENDING_TIMEOUT)
    alive = [t.name for t in workers if t.is_alive()]
    if alive:
        raise AssertionError(f"py4j finalizer workers still running: {alive}")
    SparkContext._gateway = None
    SparkContext._jvm = None
