"""Count the Spark jobs an action starts, from the driver's status tracker.

Every job the code under test starts carries the job group set here, including the
map-stage jobs adaptive query execution submits for each shuffle, so the count is the
number of jobs Spark ran for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from py4j.clientserver import ClientServerConnection


class JobCount:
    def __init__(self) -> None:
        self.jobs = 0


@contextmanager
def counting_jobs(spark: Any) -> Iterator[JobCount]:
    """Count the jobs started inside the block (on this thread)."""
    context = spark.sparkContext
    group = f"counted-{uuid.uuid4().hex}"
    count = JobCount()
    context.setJobGroup(group, "counted")
    try:
        yield count
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)
        count.jobs = len(context.statusTracker().getJobIdsForGroup(group))


class CallCount:
    def __init__(self) -> None:
        self.calls = 0


@contextmanager
def counting_jvm_calls() -> Iterator[CallCount]:
    """Count the commands the driver sends to the JVM inside the block, but the deletions
    of Java objects the Python garbage collector releases (their number follows the
    collector, not the code under test)."""

    count = CallCount()
    send = ClientServerConnection.send_command

    def counted(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        if not command.startswith("m\nd\n"):
            count.calls += 1
        return send(self, command, *args, **kwargs)

    ClientServerConnection.send_command = counted  # type: ignore[method-assign]
    try:
        yield count
    finally:
        ClientServerConnection.send_command = send  # type: ignore[method-assign]
