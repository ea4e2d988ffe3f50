"""OpenTelemetry for docoutbox: one trace from an incoming message to every consumer.

Rule: the trace context travels in the entries' ``headers`` (W3C ``traceparent`` and
``tracestate``), so it survives the commit, any delay and any crash between commit and
publish.

- :class:`OtelStoreObserver` (set as ``StoreConfig(observer=...)``): each ``handle`` runs
  in a ``process {type}`` span, a child of the incoming message's ``traceparent`` when it
  has one (else of the current span); every entry the commit emits carries that span's
  context. It counts store conflicts and retries;
- :class:`TracingPublisher` / :class:`AsyncTracingPublisher` wrap any publisher: a
  ``publish {destination}`` span, a child of the context stored in the entry, whose own
  context replaces it in the published headers, so the consumer's ``process`` span is its
  child. Around a publisher with ``publish_many`` (a
  :class:`~docoutbox.ports.dispatch.PipelinedPublisher`) they have it too, so the
  dispatcher keeps publishing in rounds: one span per entry of a round, open while the
  round is, each ending with that entry's own outcome as the wrapped publisher reports
  it (the outcomes are returned unchanged);
- :class:`OtelMetrics`: the dispatcher's metrics through the OpenTelemetry meter: outbox
  depth and aggregates, oldest pending age, publish latency (commit to confirm), stream
  lag, publishes, failures and quarantines.

Span attributes follow the messaging semantic conventions (``messaging.system``,
``messaging.operation.type``, ``messaging.destination.name``, ``messaging.message.id``,
``messaging.message.conversation_id``), plus ``docoutbox.aggregate.*`` and
``docoutbox.seq``. ``messaging.system`` is always set: the ``system`` given, else (a
publish) the one the wrapped publisher names, else :data:`DEFAULT_SYSTEM`. Where an entry
goes is the wrapped publisher's to say: a publisher with a ``trace_attributes(entry)``
method (the RabbitMQ and Kafka publishers) gives the destination attributes of its
broker's conventions (RabbitMQ: the exchange as ``messaging.destination.name``, the
routing key as ``messaging.rabbitmq.destination.routing_key``); for any other, the
destination is the entry's ``destination``, else its type.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "docoutbox.observability.otel needs OpenTelemetry: pip install 'docoutbox[otel]'"
    ) from exc

from docoutbox.dispatch.engine.backlog import Bucket, OutboxStats
from docoutbox.dispatch.engine.lag import PendingWork
from docoutbox.errors import PublishError
from docoutbox.model import AggregateId, Message, OutboxMessage
from docoutbox.ports.dispatch import (
    AsyncPipelinedPublisher,
    AsyncPublisher,
    Closeable,
    PipelinedPublisher,
    Publisher,
    TracedPublisher,
)

SCOPE = "docoutbox"
TRACE_HEADERS = ("traceparent", "tracestate")
#: ``messaging.system`` when no broker is named: the conventions require the attribute,
#: and a store's handling (or a publisher of no known broker) is docoutbox's own.
DEFAULT_SYSTEM = "docoutbox"
DESTINATION = "messaging.destination.name"


def _attrs(**values: Any) -> dict[str, Any]:
    return {k.replace("__", "."): v for k, v in values.items() if v is not None}


class OtelStoreObserver:
    """A :class:`~docoutbox.store.observe.StoreObserver` that traces and counts handling."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: otel_metrics.MeterProvider | None = None,
        propagator: TextMapPropagator | None = None,
        system: str | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = otel_metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self.propagator = propagator or TraceContextTextMapPropagator()
        self.system = system or DEFAULT_SYSTEM
        self._conflicts = meter.create_counter(
            "docoutbox.store.conflicts",
            unit="{conflict}",
            description="Commits that lost an optimistic-concurrency race",
        )
        self._retries = meter.create_counter(
            "docoutbox.store.retries",
            unit="{retry}",
            description="Handling attempts repeated after a conflict or a transient error",
        )

    def _incoming(self, message: Message) -> Context | None:
        if "traceparent" not in message.headers:
            return None
        return self.propagator.extract(message.headers)

    @contextmanager
    def handling(
        self, aggregate_type: str, aggregate_id: AggregateId, message: Message
    ) -> Iterator[object]:
        attributes = _attrs(
            messaging__system=self.system,
            messaging__operation__type="process",
            messaging__operation__name="handle",
            messaging__message__id=message.id,
            messaging__message__conversation_id=message.correlation_id,
            docoutbox__aggregate__type=aggregate_type,
            docoutbox__aggregate__id=str(aggregate_id),
            docoutbox__message__type=message.type,
        )
        with self.tracer.start_as_current_span(
            f"process {message.type}",
            context=self._incoming(message),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        ) as span:
            yield span

    def headers(self, message: Message) -> Mapping[str, str]:
        carrier: dict[str, str] = {}
        context = None
        if not trace.get_current_span().get_span_context().is_valid:
            context = self._incoming(message)  # no span here: pass the incoming one on
        self.propagator.inject(carrier, context=context)
        return {k: v for k, v in carrier.items() if k in TRACE_HEADERS}

    def conflict(self, aggregate_type: str) -> None:
        self._conflicts.add(1, {"docoutbox.aggregate.type": aggregate_type})

    def retry(self, aggregate_type: str, reason: str) -> None:
        self._retries.add(1, {"docoutbox.aggregate.type": aggregate_type, "reason": reason})


class _PublishSpans:
    def __init__(
        self,
        inner: object,
        tracer_provider: trace.TracerProvider | None,
        propagator: TextMapPropagator | None,
        system: str | None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        self.propagator = propagator or TraceContextTextMapPropagator()
        self.system = system
        #: The wrapped publisher's own attributes of a publish (looked up once).
        self.describe: Callable[[OutboxMessage], Mapping[str, Any]] | None = (
            inner.trace_attributes if isinstance(inner, TracedPublisher) else None
        )

    def attributes(self, entry: OutboxMessage) -> dict[str, Any]:
        """The span's attributes: ours, then the publisher's, then the ``system`` given."""
        attributes = _attrs(
            messaging__system=DEFAULT_SYSTEM,
            messaging__operation__type="send",
            messaging__operation__name="publish",
            messaging__destination__name=entry.destination or entry.type,
            messaging__message__id=entry.id,
            messaging__message__conversation_id=entry.correlation_id,
            docoutbox__aggregate__type=entry.aggregate_type,
            docoutbox__aggregate__id=str(entry.aggregate_id),
            docoutbox__seq=entry.seq,
            docoutbox__message__type=entry.type,
        )
        if self.describe is not None:
            attributes.update(self.describe(entry))
        if self.system is not None:
            attributes["messaging.system"] = self.system
        return attributes

    @contextmanager
    def span(self, entry: OutboxMessage) -> Iterator[OutboxMessage]:
        span, traced = self.start(entry)
        with trace.use_span(span, end_on_exit=True):
            yield traced

    def start(self, entry: OutboxMessage) -> tuple[Span, OutboxMessage]:
        """A started ``publish`` span for ``entry`` (not made current, so the spans of
        one round are siblings), and the entry to publish, carrying that span's context."""
        parent = self.propagator.extract(entry.headers) if "traceparent" in entry.headers else None
        attributes = self.attributes(entry)
        span = self.tracer.start_span(
            f"publish {attributes[DESTINATION]}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )
        carrier = {k: v for k, v in entry.headers.items() if k not in TRACE_HEADERS}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return span, entry.model_copy(update={"headers": carrier})

    def round(self, entries: Sequence[OutboxMessage]) -> tuple[list[Span], list[OutboxMessage]]:
        """The spans of a round's entries, started, and the entries to publish."""
        started = [self.start(entry) for entry in entries]
        return [span for span, _ in started], [traced for _, traced in started]

    @staticmethod
    def end(spans: Sequence[Span], outcomes: Sequence[BaseException | None]) -> None:
        """End each span with its entry's outcome: an error is recorded on the span and
        sets its status, as a failed :meth:`span` does."""
        for span, error in zip(spans, outcomes, strict=True):
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()


class TracingPublisher:
    """A :class:`~docoutbox.ports.dispatch.Publisher` that publishes in a span (a
    :class:`PipelinedTracingPublisher` around a publisher with ``publish_many``)."""

    def __new__(cls, inner: Publisher, *args: Any, **options: Any) -> TracingPublisher:
        pipelined = cls is TracingPublisher and isinstance(inner, PipelinedPublisher)
        return object.__new__(PipelinedTracingPublisher if pipelined else cls)

    def __init__(
        self,
        inner: Publisher,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        system: str | None = None,
    ) -> None:
        self.inner = inner
        self._spans = _PublishSpans(inner, tracer_provider, propagator, system)

    def publish(self, entry: OutboxMessage) -> None:
        with self._spans.span(entry) as traced:
            self.inner.publish(traced)

    def close(self) -> None:
        if isinstance(self.inner, Closeable):
            self.inner.close()


class PipelinedTracingPublisher(TracingPublisher):
    """A :class:`TracingPublisher` around a publisher with ``publish_many``."""

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The round published by the wrapped publisher, one span per entry, each ended
        with that entry's outcome; the outcomes are the wrapped publisher's, unchanged.
        A round that raises records its error on every span and raises it."""
        assert isinstance(self.inner, PipelinedPublisher)
        spans, traced = self._spans.round(entries)
        try:
            outcomes = self.inner.publish_many(traced)
        except BaseException as exc:
            self._spans.end(spans, [exc] * len(spans))
            raise
        self._spans.end(spans, _padded(outcomes, len(spans)))
        return outcomes


def _padded(outcomes: Sequence[Exception | None], count: int) -> list[Exception | None]:
    """``outcomes`` cut or padded to ``count`` (the dispatcher refuses a reply of the
    wrong length itself; the spans end either way)."""
    missing = PublishError("the publisher gave no outcome for this entry")
    return [*outcomes[:count], *[missing] * (count - len(outcomes))]


class AsyncTracingPublisher:
    """The async twin of :class:`TracingPublisher` (an :class:`AsyncPipelinedTracingPublisher`
    around a publisher with ``publish_many``)."""

    def __new__(cls, inner: AsyncPublisher, *args: Any, **options: Any) -> AsyncTracingPublisher:
        pipelined = cls is AsyncTracingPublisher and isinstance(inner, AsyncPipelinedPublisher)
        return object.__new__(AsyncPipelinedTracingPublisher if pipelined else cls)

    def __init__(
        self,
        inner: AsyncPublisher,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        system: str | None = None,
    ) -> None:
        self.inner = inner
        self._spans = _PublishSpans(inner, tracer_provider, propagator, system)

    async def publish(self, entry: OutboxMessage) -> None:
        with self._spans.span(entry) as traced:
            await self.inner.publish(traced)


class AsyncPipelinedTracingPublisher(AsyncTracingPublisher):
    """An :class:`AsyncTracingPublisher` around a publisher with ``publish_many``."""

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The async twin of :meth:`PipelinedTracingPublisher.publish_many`."""
        assert isinstance(self.inner, AsyncPipelinedPublisher)
        spans, traced = self._spans.round(entries)
        try:
            outcomes = await self.inner.publish_many(traced)
        except BaseException as exc:
            self._spans.end(spans, [exc] * len(spans))
            raise
        self._spans.end(spans, _padded(outcomes, len(spans)))
        return outcomes


class OtelMetrics:
    """The dispatcher's :class:`~docoutbox.dispatch.engine.metrics.Metrics` through an OTel meter.

    Gauges (depth, aggregates, oldest age) report the last backlog measurement
    (:class:`~docoutbox.dispatch.engine.backlog.BacklogMonitor`); the
    ``docoutbox.pending_work.*`` gauges the last pending work per partition or feed range
    (attributes ``docoutbox.partition`` and ``docoutbox.partition.unit``).
    """

    def __init__(self, *, meter_provider: otel_metrics.MeterProvider | None = None) -> None:
        meter = otel_metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self._lock = threading.Lock()
        self._stats: OutboxStats | None = None
        self._stream_lag: float | None = None
        self._work: PendingWork | None = None
        self._published = meter.create_counter(
            "docoutbox.published", unit="{message}", description="Entries confirmed by the broker"
        )
        self._failures = meter.create_counter(
            "docoutbox.publish.failures", unit="{attempt}", description="Failed publish attempts"
        )
        self._quarantined = meter.create_counter(
            "docoutbox.quarantined", unit="{message}", description="Entries sent to dead letters"
        )
        self._latency = meter.create_histogram(
            "docoutbox.publish.latency", unit="s", description="From commit to broker confirm"
        )
        meter.create_observable_gauge(
            "docoutbox.outbox.depth",
            [self._observe(lambda stats: stats.entries)],
            unit="{message}",
            description="Pending outbox entries in the database",
        )
        meter.create_observable_gauge(
            "docoutbox.outbox.aggregates",
            [self._observe(lambda stats: stats.aggregates)],
            unit="{aggregate}",
            description="Aggregates with pending outbox entries",
        )
        meter.create_observable_gauge(
            "docoutbox.outbox.oldest_age",
            [self._observe(lambda stats: stats.oldest_age)],
            unit="s",
            description="Age of the oldest pending entry",
        )
        meter.create_observable_gauge(
            "docoutbox.pending_work.entries",
            [self._observe_work(lambda bucket: bucket.entries)],
            unit="{message}",
            description="Pending entries per partition or feed range (0 for an idle one)",
        )
        meter.create_observable_gauge(
            "docoutbox.pending_work.oldest_age",
            [self._observe_work(lambda bucket: bucket.oldest_age)],
            unit="s",
            description="Age of the oldest pending entry per partition or feed range",
        )
        meter.create_observable_gauge(
            "docoutbox.pending_work.partitions",
            [self._observe_partitions],
            unit="{partition}",
            description="How many partitions or feed ranges the work is split into",
        )
        meter.create_observable_gauge(
            "docoutbox.stream.lag",
            [self._observe_lag],
            unit="s",
            description="From a document's commit to the dispatcher seeing its change event",
        )

    def _observe(self, figure: Callable[[OutboxStats], float]) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                stats = self._stats
            return [] if stats is None else [Observation(figure(stats))]

        return callback

    def _observe_work(self, figure: Callable[[Bucket], float]) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                work = self._work
            if work is None:
                return []
            return [
                Observation(
                    figure(bucket),
                    {"docoutbox.partition": partition, "docoutbox.partition.unit": work.unit},
                )
                for partition, bucket in sorted(work.by_partition.items())
            ]

        return callback

    def _observe_partitions(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            work = self._work
        if work is None:
            return []
        count = work.partitions if work.partitions is not None else len(work.by_partition)
        return [Observation(count, {"docoutbox.partition.unit": work.unit})]

    def _observe_lag(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            lag = self._stream_lag
        return [] if lag is None else [Observation(lag)]

    def published(self, entry: OutboxMessage, lag: float) -> None:
        attributes = {"messaging.destination.name": entry.destination or entry.type}
        self._published.add(1, attributes)
        self._latency.record(max(0.0, lag), attributes)

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        self._failures.add(1, {"error.type": type(error).__name__})

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None:
        self._quarantined.add(1)

    def backlog(self, aggregates: int) -> None:
        return None  # reported with the whole measurement in outbox()

    def outbox(self, stats: OutboxStats) -> None:
        with self._lock:
            self._stats = stats

    def stream_lag(self, seconds: float) -> None:
        with self._lock:
            self._stream_lag = seconds

    def pending_work(self, work: PendingWork) -> None:
        with self._lock:
            self._work = work
