"""Prometheus metrics for the dispatcher and the stores (``docoutbox[prometheus]``).

:class:`PrometheusMetrics` is a dispatcher :class:`~docoutbox.dispatch.engine.metrics.Metrics`;
the ``docoutbox_outbox_*`` gauges are the outbox backlog as last measured in the database
by a :class:`~docoutbox.dispatch.engine.backlog.BacklogMonitor` (never the dispatcher's in-memory
queue, which is ``docoutbox_dispatcher_queued``). The ``docoutbox_pending_work_*`` gauges
are the pending work per partition or feed range (:mod:`~docoutbox.dispatch.engine.lag`),
one series per partition (idle ones read 0), labelled ``unit`` (``partition`` or
``feed_range``): what a scaler reads. :class:`PrometheusStoreObserver` counts store
conflicts and retries in the processes that handle messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "docoutbox.observability.prometheus needs prometheus_client: "
        "pip install 'docoutbox[prometheus]'"
    ) from exc

from docoutbox.dispatch.engine.backlog import OutboxStats
from docoutbox.dispatch.engine.lag import PendingWork
from docoutbox.model import AggregateId, Message, OutboxMessage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class PrometheusMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.published_total = Counter(
            "docoutbox_published", "Entries confirmed by the broker", registry=r
        )
        self.failures_total = Counter(
            "docoutbox_publish_failures", "Failed publish attempts", ["error"], registry=r
        )
        self.quarantined_total = Counter(
            "docoutbox_quarantined", "Entries sent to dead letters", registry=r
        )
        self.latency = Histogram(
            "docoutbox_publish_latency_seconds",
            "From commit to broker confirm",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.depth = Gauge(
            "docoutbox_outbox_pending_entries", "Pending outbox entries in the database", registry=r
        )
        self.aggregates = Gauge(
            "docoutbox_outbox_pending_aggregates",
            "Aggregates with pending entries in the database (the backlog)",
            registry=r,
        )
        self.oldest_age = Gauge(
            "docoutbox_outbox_oldest_age_seconds", "Age of the oldest pending entry", registry=r
        )
        self.partition_depth = Gauge(
            "docoutbox_outbox_partition_pending_entries",
            "Pending entries per partition",
            ["partition"],
            registry=r,
        )
        self.measured_at = Gauge(
            "docoutbox_outbox_measured_timestamp_seconds",
            "When the backlog was last measured",
            registry=r,
        )
        self.stream_lag_seconds = Gauge(
            "docoutbox_stream_lag_seconds",
            "From a document's commit to the dispatcher seeing its change event",
            registry=r,
        )
        self.queued = Gauge(
            "docoutbox_dispatcher_queued", "Aggregates in the dispatcher's work queue", registry=r
        )
        self.work_entries = Gauge(
            "docoutbox_pending_work_entries",
            "Pending entries per partition or feed range (0 for an idle one)",
            ["unit", "partition"],
            registry=r,
        )
        self.work_oldest_age = Gauge(
            "docoutbox_pending_work_oldest_age_seconds",
            "Age of the oldest pending entry per partition or feed range",
            ["unit", "partition"],
            registry=r,
        )
        self.work_partitions = Gauge(
            "docoutbox_pending_work_partitions",
            "How many partitions or feed ranges the work is split into",
            ["unit"],
            registry=r,
        )

    def watch_queue(self, queued: Callable[[], int]) -> None:
        """Report ``queued()`` (e.g. ``dispatcher.queued``) at every scrape."""
        self.queued.set_function(lambda: float(queued()))

    def published(self, entry: OutboxMessage, lag: float) -> None:
        self.published_total.inc()
        self.latency.observe(max(0.0, lag))

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        self.failures_total.labels(type(error).__name__).inc()

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None:
        self.quarantined_total.inc()

    def backlog(self, aggregates: int) -> None:
        self.aggregates.set(aggregates)

    def outbox(self, stats: OutboxStats) -> None:
        self.depth.set(stats.entries)
        self.aggregates.set(stats.aggregates)
        self.oldest_age.set(stats.oldest_age)
        self.measured_at.set(stats.measured_at.timestamp())
        self.partition_depth.clear()
        for partition, bucket in stats.by_partition.items():
            self.partition_depth.labels(str(partition)).set(bucket.entries)

    def stream_lag(self, seconds: float) -> None:
        self.stream_lag_seconds.set(seconds)

    def pending_work(self, work: PendingWork) -> None:
        self.work_entries.clear()
        self.work_oldest_age.clear()
        self.work_partitions.clear()
        for partition, bucket in work.by_partition.items():
            self.work_entries.labels(work.unit, str(partition)).set(bucket.entries)
            self.work_oldest_age.labels(work.unit, str(partition)).set(bucket.oldest_age)
        self.work_partitions.labels(work.unit).set(
            work.partitions if work.partitions is not None else len(work.by_partition)
        )

    def exposition(self) -> tuple[bytes, str]:
        """The text format of every metric in the registry, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class PrometheusStoreObserver:
    """A :class:`~docoutbox.store.observe.StoreObserver` counting conflicts and retries."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.conflicts = Counter(
            "docoutbox_store_conflicts",
            "Commits that lost an optimistic-concurrency race",
            ["aggregate_type"],
            registry=self.registry,
        )
        self.retries = Counter(
            "docoutbox_store_retries",
            "Handling attempts repeated after a conflict or a transient error",
            ["aggregate_type", "reason"],
            registry=self.registry,
        )

    @contextmanager
    def handling(
        self, aggregate_type: str, aggregate_id: AggregateId, message: Message
    ) -> Iterator[object]:
        yield None

    def headers(self, message: Message) -> Mapping[str, str]:
        return {}

    def conflict(self, aggregate_type: str) -> None:
        self.conflicts.labels(aggregate_type).inc()

    def retry(self, aggregate_type: str, reason: str) -> None:
        self.retries.labels(aggregate_type, reason).inc()
