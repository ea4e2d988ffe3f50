"""The outbox backlog: what is pending in the database, measured, not guessed.

Rule: "backlog" means entries committed and not yet published, as stored. The dispatcher's
in-memory work queue is a different figure (``queued``); it can read 1 while thousands of
documents wait.

- :class:`OutboxStats`: pending entries and aggregates, the oldest entry's age, per
  partition and per type. :func:`summarize` computes it from documents (pure);
- :class:`BacklogProbe`: anything that can measure it (:func:`probe_backend` pages through
  any :class:`~docoutbox.ports.store.StoreBackend`; adapters offer cheaper projections);
- :class:`BacklogMonitor`: measures every ``interval`` seconds on its own thread and hands
  the figures to the metrics (``backlog(aggregates)``, and ``outbox(stats)`` where the
  metrics have it; with a ``work`` probe, also ``pending_work(work)`` of
  :mod:`~docoutbox.dispatch.engine.lag`);
- :class:`ProgressMetrics`: counting metrics whose periodic ``progress`` line carries the
  backlog, the publish rate and an ETA.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from docoutbox.dispatch.engine.metrics import CountingMetrics, Metrics, StreamLagMetrics
from docoutbox.errors import StoreError
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.ports.store import StoreBackend
from docoutbox.store.document import ID, Document, utcnow

log = logging.getLogger("docoutbox.metrics")


@dataclass(frozen=True)
class Bucket:
    """Pending entries and aggregates of one partition or one type."""

    entries: int = 0
    aggregates: int = 0
    oldest_age: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "aggregates": self.aggregates,
            "oldest_age_s": round(self.oldest_age, 3),
        }


@dataclass(frozen=True)
class OutboxStats:
    """The backlog at ``measured_at``; ages in seconds (0 when nothing is pending)."""

    entries: int
    aggregates: int
    oldest_age: float
    oldest_at: datetime | None
    measured_at: datetime
    by_partition: dict[int, Bucket] = field(default_factory=dict)
    by_type: dict[str, Bucket] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "aggregates": self.aggregates,
            "oldest_age_s": round(self.oldest_age, 3),
            "oldest_at": self.oldest_at.isoformat() if self.oldest_at else None,
            "measured_at": self.measured_at.isoformat(),
            "by_partition": {str(p): b.to_json() for p, b in sorted(self.by_partition.items())},
            "by_type": {t: b.to_json() for t, b in sorted(self.by_type.items())},
        }


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class _Acc:
    __slots__ = ("aggregates", "entries", "oldest")

    def __init__(self) -> None:
        self.entries = 0
        self.aggregates: set[AggregateId] = set()
        self.oldest: datetime | None = None

    def add(self, aggregate_id: AggregateId, created: datetime | None) -> None:
        self.entries += 1
        self.aggregates.add(aggregate_id)
        if created is not None and (self.oldest is None or created < self.oldest):
            self.oldest = created

    def bucket(self, now: datetime) -> Bucket:
        return Bucket(self.entries, len(self.aggregates), _age(self.oldest, now))


def _age(oldest: datetime | None, now: datetime) -> float:
    return max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0


def summarize(docs: Iterable[Document], now: datetime | None = None) -> OutboxStats:
    """The backlog of ``docs`` (documents, or projections with ``_id``, ``partition`` and
    the outbox entries' ``type`` and ``created_at``)."""
    now = now or utcnow()
    total = _Acc()
    parts: dict[int, _Acc] = {}
    types: dict[str, _Acc] = {}
    for doc in docs:
        outbox = doc.get("outbox") or []
        aggregate_id = doc.get(ID)
        if not outbox or isinstance(aggregate_id, bool):
            continue
        if not isinstance(aggregate_id, str | int):
            aggregate_id = repr(aggregate_id)
        partition = doc.get("partition")
        for entry in outbox:
            entry = entry if isinstance(entry, dict) else {}
            created = _aware(entry.get("created_at"))
            kind = entry.get("type")
            total.add(aggregate_id, created)
            if isinstance(partition, int) and not isinstance(partition, bool):
                parts.setdefault(partition, _Acc()).add(aggregate_id, created)
            types.setdefault(kind if isinstance(kind, str) else "?", _Acc()).add(
                aggregate_id, created
            )
    return OutboxStats(
        entries=total.entries,
        aggregates=len(total.aggregates),
        oldest_age=_age(total.oldest, now),
        oldest_at=total.oldest,
        measured_at=now,
        by_partition={p: a.bucket(now) for p, a in parts.items()},
        by_type={t: a.bucket(now) for t, a in types.items()},
    )


class BacklogProbe(Protocol):
    def __call__(self) -> OutboxStats: ...


def probe_backend(backend: StoreBackend, page: int = 500) -> BacklogProbe:
    """A probe that pages through ``backend.find_pending`` (works with every store)."""

    def measure() -> OutboxStats:
        docs: list[Document] = []
        after: AggregateId | None = None
        while True:
            batch = backend.find_pending(after=after, limit=page)
            docs.extend(batch)
            if len(batch) < page:
                return summarize(docs)
            after = batch[-1][ID]

    return measure


@runtime_checkable
class OutboxMetrics(Protocol):
    """Metrics that take the whole measurement (optional beside :class:`Metrics`)."""

    def outbox(self, stats: OutboxStats) -> None: ...


@runtime_checkable
class PendingWorkMetrics(Protocol):
    """Metrics that take the pending work per partition (optional beside :class:`Metrics`;
    ``work`` is a :class:`~docoutbox.dispatch.engine.lag.PendingWork`)."""

    def pending_work(self, work: Any) -> None: ...


class BacklogMonitor:
    """Measures the backlog every ``interval`` seconds and reports it to ``metrics``.

    A failed measurement is logged and retried at the next interval; the last good figures
    stay (``last``), with ``failures`` counting consecutive failures. ``work``, when given,
    measures the pending work per partition at the same pace (``last_work``).
    """

    def __init__(
        self,
        probe: BacklogProbe,
        metrics: Metrics | Iterable[Metrics],
        *,
        interval: float = 5.0,
        work: Callable[[], Any] | None = None,
    ) -> None:
        self.probe = probe
        self.metrics = [metrics] if not isinstance(metrics, Iterable) else list(metrics)
        self.work = work
        self._work_metrics: list[PendingWorkMetrics] = [
            m for m in self.metrics if isinstance(m, PendingWorkMetrics)
        ]
        self.interval = interval
        self.last: OutboxStats | None = None
        self.last_work: Any = None
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def measure(self, *, report: bool = True) -> OutboxStats | None:
        """Measure now; hand the figures to the metrics unless ``report`` is False (the
        last figures, ``last``, are kept either way). None if the measurement failed."""
        try:
            stats = self.probe()
        except StoreError as exc:
            self.failures += 1
            log.warning("backlog_measure_failed error=%r", exc)
            return None
        self.failures = 0
        self.last = stats
        if not report:
            return stats
        for metrics in self.metrics:
            if isinstance(metrics, OutboxMetrics):
                metrics.outbox(stats)
            metrics.backlog(stats.aggregates)
        if self.work is not None:
            self._measure_work(self.work)
        return stats

    def _measure_work(self, probe: Callable[[], Any]) -> None:
        try:
            work = probe()
        except StoreError as exc:
            log.warning("pending_work_measure_failed error=%r", exc)
            return
        self.last_work = work
        for metrics in self._work_metrics:
            metrics.pending_work(work)

    def start(self) -> None:
        self.measure()
        self._thread = threading.Thread(target=self._loop, name="docoutbox-backlog", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.measure()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class ProgressMetrics(CountingMetrics):
    """Counting metrics that log a ``progress`` line on a backlog measurement once ``every``
    seconds have passed since the previous line was due (lines keep that pace, without
    drift, as long as measurements are at least as frequent): published so far, the
    backlog in the database as just measured, the publish rate and the ETA to drain the
    backlog at that rate, and ``lag_s``, the largest lag of the entries published since
    the previous line (0 when none were: an idle dispatcher that caught up has no lag;
    entries still waiting show in ``oldest_age_s``). :meth:`final` logs the last line."""

    def __init__(
        self, every: float = 10.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._every = every
        self._mono = monotonic
        self._next = monotonic() + every
        self._mark: tuple[float, int] = (monotonic(), 0)
        self.stats: OutboxStats | None = None

    def outbox(self, stats: OutboxStats) -> None:
        self.stats = stats

    def backlog(self, aggregates: int) -> None:
        super().backlog(aggregates)
        now = self._mono()
        if now >= self._next:
            # The next line is due ``every`` after this one was, not after it was logged.
            self._next = max(self._next + self._every, now + self._every / 2)
            self.report()

    def final(self, stats: OutboxStats | None) -> None:
        """Log the last line, with ``stats`` (a measurement taken for it) when given."""
        if stats is not None:
            self.stats = stats
        self.report()

    def eta(self) -> tuple[float, float | None]:
        """(publish rate per second since the last line, seconds to drain or None)."""
        now, published = self._mono(), self.totals().published
        since, before = self._mark
        rate = (published - before) / (now - since) if now > since else 0.0
        pending = self.stats.entries if self.stats is not None else 0
        if pending == 0:
            return rate, 0.0
        return rate, (pending / rate if rate > 0 else None)

    def report(self) -> None:
        t = self.totals()
        rate, eta = self.eta()
        self._mark = (self._mono(), t.published)
        lag = self.recent_lag()
        stats = self.stats
        log.info(
            "progress published=%d failed=%d quarantined=%d backlog_entries=%d "
            "backlog_aggregates=%d oldest_age_s=%.1f rate_per_s=%.1f eta_s=%s lag_s=%.3f",
            t.published,
            t.failed,
            t.quarantined,
            stats.entries if stats else 0,
            stats.aggregates if stats else t.backlog,
            stats.oldest_age if stats else 0.0,
            rate,
            "unknown" if eta is None else f"{eta:.0f}",
            lag,
        )


def stream_lag(doc: Document, now: datetime | None = None) -> float | None:
    """Seconds from the document's last write to ``now`` (None if it has no timestamp)."""
    written = _aware(doc.get("updated_at"))
    if written is None:
        return None
    return max(0.0, ((now or utcnow()) - written).total_seconds())


class Fanout:
    """Hands every metrics call to each of ``targets`` (optional hooks where they exist)."""

    def __init__(self, *targets: Metrics) -> None:
        self.targets = targets
        self._outbox = [t for t in targets if isinstance(t, OutboxMetrics)]
        self._lag = [t for t in targets if isinstance(t, StreamLagMetrics)]
        self._work = [t for t in targets if isinstance(t, PendingWorkMetrics)]

    def published(self, entry: OutboxMessage, lag: float) -> None:
        for target in self.targets:
            target.published(entry, lag)

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        for target in self.targets:
            target.failed(entry, error)

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None:
        for target in self.targets:
            target.quarantined(aggregate_id, entry_id, error)

    def backlog(self, aggregates: int) -> None:
        for target in self.targets:
            target.backlog(aggregates)

    def outbox(self, stats: OutboxStats) -> None:
        for target in self._outbox:
            target.outbox(stats)

    def stream_lag(self, seconds: float) -> None:
        for target in self._lag:
            target.stream_lag(seconds)

    def pending_work(self, work: Any) -> None:
        for target in self._work:
            target.pending_work(work)
