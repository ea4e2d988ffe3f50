"""Ending a Spark session so that nothing of it outlives the tier that used it.

``SparkSession.stop()`` stops the SparkContext but keeps the py4j gateway: its JVM and its
``FinalizerWorker`` thread, which polls a queue and sleeps a second whenever the queue is
empty. The unit tier runs after the Spark tier in the same pytest process and refuses a
sleep, so a worker left running is stopped there with an error naming it. :func:`end_session`
ends the session with the adapter's :func:`docoutbox_spark.readers.end_session` (the one
the audit command uses for a session it made), and fails if a py4j thread is left.

Import this module only where pyspark is installed (inside the Spark fixtures).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from docoutbox_spark import readers


def end_session(spark: SparkSession) -> None:
    """Stop ``spark`` and the py4j gateway it runs on: every thread and process it started
    has ended when this returns."""
    alive = readers.end_session(spark)
    if alive:
        raise AssertionError(f"py4j finalizer workers still running: {alive}")
