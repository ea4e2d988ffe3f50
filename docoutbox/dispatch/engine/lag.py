"""Pending work per partition (MongoDB's stored ``partition``) or per feed range (Cosmos
DB): what an autoscaler reads.

Rule: every partition the work is split into has a row, an idle one with zero entries, so
that a scaler sees the partition count and an idle partition reads 0 rather than
nothing; figures are entries committed and not yet published, as stored (like
:mod:`~docoutbox.dispatch.engine.backlog`).

- :class:`PendingWork`: per partition, the pending entries, the aggregates holding them
  and the oldest entry's age; built by :func:`pending_work` from one row per partition
  (what a database's grouping query returns), pure;
- :func:`desired_replicas`: the scale decision a KEDA-style scaler takes from the
  figure, ``ceil(pending / target per replica)``, capped by the partition count (an
  instance beyond one per partition would hold no lease);
- :class:`PendingWorkProbe`: anything that measures it (the kits' ``pending_work``); a
  :class:`~docoutbox.dispatch.engine.backlog.BacklogMonitor` given one hands each
  measurement to the metrics that take it (Prometheus, OTel).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from docoutbox.dispatch.engine.backlog import Bucket
from docoutbox.errors import InvalidInput
from docoutbox.store.document import utcnow

#: What a partition is: a stored partition number, or the index of a Cosmos DB feed range.
PARTITION = "partition"
FEED_RANGE = "feed_range"


@dataclass(frozen=True)
class Row:
    """What a grouping query returns for one partition."""

    partition: int | None  # None: documents without a partition number
    entries: int
    aggregates: int
    oldest: datetime | None


@dataclass(frozen=True)
class PendingWork:
    """The pending work at ``measured_at``, per partition (``unit``: ``partition`` or
    ``feed_range``). ``partitions`` is how many there are, when known; ``unassigned``
    counts what no partition holds (documents written without a partition number)."""

    unit: str
    partitions: int | None
    by_partition: dict[int, Bucket]
    measured_at: datetime
    unassigned: Bucket = field(default_factory=Bucket)

    @property
    def entries(self) -> int:
        return sum(b.entries for b in self.by_partition.values()) + self.unassigned.entries

    @property
    def aggregates(self) -> int:
        return sum(b.aggregates for b in self.by_partition.values()) + self.unassigned.aggregates

    @property
    def oldest_age(self) -> float:
        ages = [b.oldest_age for b in self.by_partition.values()]
        return max([*ages, self.unassigned.oldest_age])

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "partitions": self.partitions,
            "entries": self.entries,
            "aggregates": self.aggregates,
            "oldest_age_s": round(self.oldest_age, 3),
            "measured_at": self.measured_at.isoformat(),
            "by_partition": {str(p): b.to_json() for p, b in sorted(self.by_partition.items())},
            "unassigned": self.unassigned.to_json(),
        }


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _bucket(row: Row, now: datetime) -> Bucket:
    oldest = _aware(row.oldest)
    age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return Bucket(row.entries, row.aggregates, age)


def pending_work(
    rows: Iterable[Row],
    *,
    unit: str = PARTITION,
    partitions: int | None = None,
    now: datetime | None = None,
) -> PendingWork:
    """The pending work of ``rows`` (one per partition; several for one partition add up),
    with an empty bucket for every partition of ``range(partitions)`` that has no row."""
    now = now or utcnow()
    if partitions is not None and partitions < 1:
        raise InvalidInput(f"partitions must be at least 1, got {partitions}")
    merged: dict[int | None, Row] = {}
    for row in rows:
        key = row.partition if type(row.partition) is int else None
        before = merged.get(key)
        if before is not None:
            olds = [t for t in (_aware(before.oldest), _aware(row.oldest)) if t is not None]
            row = Row(
                key,
                before.entries + row.entries,
                before.aggregates + row.aggregates,
                min(olds) if olds else None,
            )
        merged[key] = row
    by_partition = {p: _bucket(r, now) for p, r in merged.items() if p is not None}
    for p in range(partitions or 0):
        by_partition.setdefault(p, Bucket())
    empty = Row(None, 0, 0, None)
    return PendingWork(unit, partitions, by_partition, now, _bucket(merged.get(None, empty), now))


def desired_replicas(
    pending: int, target_per_replica: int, partitions: int | None, minimum: int = 0
) -> int:
    """``ceil(pending / target_per_replica)``, at least ``minimum`` and at most
    ``partitions`` (when known): KEDA's ``AverageValue`` decision with
    ``maxReplicaCount`` set to the partition count."""
    if target_per_replica < 1:
        raise InvalidInput(f"target per replica must be at least 1, got {target_per_replica}")
    if pending < 0 or minimum < 0:
        raise InvalidInput("pending entries and the minimum cannot be negative")
    wanted = max(minimum, math.ceil(pending / target_per_replica))
    return wanted if partitions is None else min(wanted, max(partitions, minimum))


class PendingWorkProbe(Protocol):
    def __call__(self) -> PendingWork: ...
