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
