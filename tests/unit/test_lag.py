"""Pending work per partition, pure: rows merged, idle partitions as zeros, the scale
decision, and the Prometheus and OpenTelemetry gauges that carry it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from docoutbox.dispatch.engine.backlog import BacklogMonitor, Bucket, Fanout, summarize
from docoutbox.dispatch.engine.lag import FEED_RANGE, Row, desired_replicas, pending_work
from docoutbox.dispatch.engine.metrics import CountingMetrics
from docoutbox.errors import InvalidInput, StoreError
from docoutbox.observability.otel import OtelMetrics
from docoutbox.observability.prometheus import PrometheusMetrics

NOW = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_rows_of_one_partition_add_up_and_idle_partitions_read_zero() -> None:
    rows = [
        Row(0, 3, 2, ago(30)),
        Row(2, 1, 1, ago(5)),
        Row(0, 2, 1, ago(45)),
        Row(None, 4, 1, ago(90)),  # written without a partition number
        Row(True, 1, 1, ago(1)),  # type: ignore[arg-type]  # not a partition number either
    ]
    work = pending_work(rows, partitions=4, now=NOW)
    assert work.by_partition == {
        0: Bucket(5, 3, 45.0),
        1: Bucket(),
        2: Bucket(1, 1, 5.0),
        3: Bucket(),
    }
    assert work.unassigned == Bucket(5, 2, 90.0)
    assert (work.entries, work.aggregates, work.oldest_age) == (11, 6, 90.0)
    shown = work.to_json()
    assert shown["by_partition"]["1"] == {"entries": 0, "aggregates": 0, "oldest_age_s": 0.0}
    assert (shown["unit"], shown["partitions"], shown["entries"]) == ("partition", 4, 11)


def test_naive_times_are_utc_and_a_row_without_time_has_age_zero() -> None:
    work = pending_work(
        [Row(1, 1, 1, ago(10).replace(tzinfo=None)), Row(3, 2, 1, None)],
        unit=FEED_RANGE,
        now=NOW,
    )
    assert work.by_partition == {1: Bucket(1, 1, 10.0), 3: Bucket(2, 1, 0.0)}
    assert work.partitions is None and work.unit == "feed_range"
    assert pending_work([], now=NOW).oldest_age == 0.0


@pytest.mark.parametrize(
    ("pending", "target", "partitions", "minimum", "replicas"),
    [
        (0, 100, 8, 0, 0),
        (0, 100, 8, 1, 1),
        (1, 100, 8, 0, 1),
        (100, 100, 8, 0, 1),
        (101, 100, 8, 0, 2),
        (10_000, 100, 8, 0, 8),  # capped: one instance per partition at most
        (10_000, 100, None, 0, 100),
        (5, 100, 2, 3, 3),  # the minimum wins over the cap
    ],
)
def test_desired_replicas(
    pending: int, target: int, partitions: int | None, minimum: int, replicas: int
) -> None:
    assert desired_replicas(pending, target, partitions, minimum) == replicas


@pytest.mark.parametrize(("pending", "target", "minimum"), [(1, 0, 0), (-1, 10, 0), (1, 10, -1)])
def test_desired_replicas_refuses_nonsense(pending: int, target: int, minimum: int) -> None:
    with pytest.raises(InvalidInput):
        desired_replicas(pending, target, 4, minimum)


def test_pending_work_refuses_a_partition_count_below_one() -> None:
    with pytest.raises(InvalidInput, match="at least 1"):
        pending_work([], partitions=0)


def samples(metrics: PrometheusMetrics, name: str) -> dict[tuple[str, ...], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.exposition()[0].decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found  # type: ignore[return-value]


def test_prometheus_has_one_series_per_partition_and_forgets_old_ones() -> None:
    metrics = PrometheusMetrics()
    metrics.pending_work(pending_work([Row(0, 7, 2, ago(12))], partitions=3, now=NOW))
    entries = samples(metrics, "docoutbox_pending_work_entries")
    assert entries == {
        (("partition", str(p)), ("unit", "partition")): v for p, v in [(0, 7), (1, 0), (2, 0)]
    }
    ages = samples(metrics, "docoutbox_pending_work_oldest_age_seconds")
    assert ages[(("partition", "0"), ("unit", "partition"))] == 12.0
    assert samples(metrics, "docoutbox_pending_work_partitions") == {(("unit", "partition"),): 3}
    metrics.pending_work(pending_work([Row(1, 2, 1, ago(1))], unit=FEED_RANGE, now=NOW))
    assert samples(metrics, "docoutbox_pending_work_entries") == {
        (("partition", "1"), ("unit", "feed_range")): 2.0
    }
    assert samples(metrics, "docoutbox_pending_work_partitions") == {(("unit", "feed_range"),): 1}


def otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    return points


def test_otel_gauges_carry_the_partition_and_its_unit() -> None:
    reader = InMemoryMetricReader()
    # An empty resource: the default one runs its detectors on a thread pool.
    provider = MeterProvider(metric_readers=[reader], resource=Resource({}))
    metrics = OtelMetrics(meter_provider=provider)
    assert "docoutbox.pending_work.entries" not in otel_points(reader)  # nothing measured yet
    metrics.pending_work(
        pending_work([Row(1, 4, 2, ago(20))], unit=FEED_RANGE, partitions=2, now=NOW)
    )
    points = otel_points(reader)
    entries = {
        (p.attributes["docoutbox.partition"], p.attributes["docoutbox.partition.unit"]): p.value
        for p in points["docoutbox.pending_work.entries"]
    }
    assert entries == {(0, "feed_range"): 0, (1, "feed_range"): 4}
    (count,) = points["docoutbox.pending_work.partitions"]
    assert count.value == 2 and count.attributes == {"docoutbox.partition.unit": "feed_range"}
    ages = {
        p.attributes["docoutbox.partition"]: p.value
        for p in points["docoutbox.pending_work.oldest_age"]
    }
    assert ages == {0: 0.0, 1: 20.0}


class Recorder:
    def __init__(self) -> None:
        self.works: list[Any] = []
        self.backlogs: list[int] = []

    def published(self, entry: Any, lag: float) -> None: ...
    def failed(self, entry: Any, error: BaseException) -> None: ...
    def quarantined(self, aggregate_id: Any, entry_id: str | None, error: str) -> None: ...

    def backlog(self, aggregates: int) -> None:
        self.backlogs.append(aggregates)

    def pending_work(self, work: Any) -> None:
        self.works.append(work)


def test_the_backlog_monitor_hands_pending_work_on_and_survives_a_failed_measure() -> None:
    stats = summarize([], NOW)
    recorder, plain = Recorder(), CountingMetrics()
    answers: list[Any] = [StoreError("down"), pending_work([Row(0, 1, 1, ago(3))], now=NOW)]

    def work() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monitor = BacklogMonitor(lambda: stats, Fanout(recorder, plain), work=work)
    assert monitor.measure() is stats and monitor.last_work is None  # stats still reported
    assert recorder.backlogs == [0] and recorder.works == []
    monitor.measure()
    assert [w.entries for w in recorder.works] == [1] and monitor.last_work is recorder.works[0]
