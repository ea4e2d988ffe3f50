"""Tracing, metrics, backlog, health and logging pieces, in memory."""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from docoutbox import AggregateStore, AsyncAggregateStore, Message, StoreConfig, emit
from docoutbox.codec import decode_message, encode_entry
from docoutbox.dispatch.engine.backlog import (
    BacklogMonitor,
    Fanout,
    OutboxStats,
    ProgressMetrics,
    probe_backend,
    stream_lag,
    summarize,
)
from docoutbox.errors import InvalidMessage, PublishError, TransientStoreError
from docoutbox.handlers import Decision, Handlers
from docoutbox.model import Aggregate, OutboxMessage
from docoutbox.observability.otel import (
    AsyncTracingPublisher,
    OtelMetrics,
    OtelStoreObserver,
    TracingPublisher,
)
from docoutbox.observability.prometheus import PrometheusStoreObserver
from docoutbox.ports.dispatch import AsyncPipelinedPublisher, PipelinedPublisher
from docoutbox.receive import Action, HandlerRetry, Rejects, receive_retrying
from docoutbox.testing import (
    AsyncMemoryBackend,
    AsyncMemoryPublisher,
    MemoryBackend,
    MemoryDeadLetters,
    MemoryPublisher,
    mongo_server,
)
from docoutbox_app import logs
from docoutbox_kafka import KafkaPublisher
from docoutbox_rabbitmq import RabbitPublisher
from tests.support import loopless

#: An empty resource: ``Resource.create``, the providers' default, runs its detectors on a
#: thread pool.
QUIET = Resource({})
#: When the figures of a test's measurement were taken.
MEASURED = datetime(2030, 1, 1, tzinfo=UTC)


class Box(Aggregate):
    n: int = 0


handlers: Handlers[Box] = Handlers()


@handlers.on("Put")
def put(state: Box, message: Message) -> Decision[Box]:
    own = message.payload.get("own")
    headers = {"traceparent": str(own)} if own else {}
    return Decision(Box(n=state.n + 1), emit("Out", {"k": 1}, headers=headers), emit("Out2"))


def tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=QUIET)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_each_emitted_entry_carries_the_handling_span_and_own_headers_win() -> None:
    provider, exporter = tracer()
    store = AggregateStore(
        MemoryBackend(), Box, StoreConfig(observer=OtelStoreObserver(tracer_provider=provider))
    )
    message = Message(id="m1", type="Put", payload={"own": "x"})
    outcome = store.handle("b1", message, handlers, create=True)
    (span,) = exporter.get_finished_spans()
    assert span.name == "process Put" and span.parent is None
    own, traced = store.get("b1").outbox
    assert own.headers == {"traceparent": "x"}  # the handler's own header wins
    assert traced.headers["traceparent"].startswith(
        f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"
    )
    assert outcome.emitted[1].headers == traced.headers


def test_async_store_traces_the_same_way() -> None:

    provider, exporter = tracer()
    store = AsyncAggregateStore(
        AsyncMemoryBackend(),
        Box,
        StoreConfig(observer=OtelStoreObserver(tracer_provider=provider)),
    )
    carrier: dict[str, str] = {}
    with provider.get_tracer("t").start_as_current_span("up") as up:
        TraceContextTextMapPropagator().inject(carrier)
    message = Message(id="m1", type="Put", headers=carrier)
    outcome = loopless.run(store.handle("b1", message, handlers, create=True))
    span = next(s for s in exporter.get_finished_spans() if s.name == "process Put")
    assert span.parent is not None and span.parent.span_id == up.get_span_context().span_id
    assert f"{span.context.span_id:016x}" in outcome.emitted[0].headers["traceparent"]


def test_without_a_span_the_incoming_context_is_passed_on() -> None:
    observer = OtelStoreObserver(tracer_provider=TracerProvider(resource=QUIET))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = Message(id="m", type="T", headers={"traceparent": parent, "tracestate": "a=1"})
    assert observer.headers(message) == {"traceparent": parent, "tracestate": "a=1"}
    assert observer.headers(Message(id="m", type="T")) == {}


def test_the_publish_span_continues_the_stored_context_and_replaces_it() -> None:
    provider, exporter = tracer()
    inner = MemoryPublisher()
    store = AggregateStore(
        MemoryBackend(), Box, StoreConfig(observer=OtelStoreObserver(tracer_provider=provider))
    )
    entry = store.handle("b1", Message(id="m1", type="Put"), handlers, create=True).emitted[1]
    TracingPublisher(inner, tracer_provider=provider, system="rabbitmq").publish(entry)
    handling, publish = exporter.get_finished_spans()
    assert publish.parent is not None and publish.parent.span_id == handling.context.span_id
    (sent,) = inner.published
    assert sent.id == entry.id and sent.seq == entry.seq
    assert f"{publish.context.span_id:016x}" in sent.headers["traceparent"]


def test_spans_always_name_the_messaging_system() -> None:
    """The README's ``OtelStoreObserver()`` and a publisher of no known broker still set
    ``messaging.system``, which the conventions require."""
    provider, exporter = tracer()
    store = AggregateStore(
        MemoryBackend(), Box, StoreConfig(observer=OtelStoreObserver(tracer_provider=provider))
    )
    entry = store.handle("b1", Message(id="m1", type="Put"), handlers, create=True).emitted[0]
    TracingPublisher(MemoryPublisher(), tracer_provider=provider).publish(entry)
    handling, publish = exporter.get_finished_spans()
    assert handling.attributes is not None and publish.attributes is not None
    assert handling.attributes["messaging.system"] == "docoutbox"
    assert publish.attributes["messaging.system"] == "docoutbox"
    assert publish.attributes["messaging.destination.name"] == entry.type


def test_rabbitmq_publish_spans_name_the_exchange_and_the_routing_key() -> None:

    provider, exporter = tracer()
    store = AggregateStore(MemoryBackend(), Box)
    entry = store.handle("b1", Message(id="m1", type="Put"), handlers, create=True).emitted[0]

    class Recording(RabbitPublisher):
        def publish(self, entry: Any) -> None:  # no broker: the span's attributes only
            return None

    for exchange, shown in (("orders", "orders"), ("", "amq.default")):
        inner = Recording("amqp://guest:guest@127.0.0.1:1/", exchange, routing_key="k")
        TracingPublisher(inner, tracer_provider=provider).publish(entry)
        span = exporter.get_finished_spans()[-1]
        assert span.attributes is not None and span.name == f"publish {shown}"
        assert span.attributes["messaging.system"] == "rabbitmq"
        assert span.attributes["messaging.destination.name"] == shown
        assert span.attributes["messaging.rabbitmq.destination.routing_key"] == "k"


def test_kafka_publish_spans_name_the_topic() -> None:

    entry = (
        AggregateStore(MemoryBackend(), Box)
        .handle("b1", Message(id="m1", type="Put"), handlers, create=True)
        .emitted[0]
    )
    publisher = KafkaPublisher({"bootstrap.servers": "127.0.0.1:1"}, "orders")
    assert publisher.trace_attributes(entry) == {
        "messaging.system": "kafka",
        "messaging.destination.name": "orders",
    }


def test_a_failed_publish_is_recorded_on_its_span_and_raised() -> None:
    provider, exporter = tracer()

    class Refusing:
        def publish(self, entry: Any) -> None:
            raise PublishError("nack")

    store = AggregateStore(MemoryBackend(), Box)
    entry = store.handle("b1", Message(id="m1", type="Put"), handlers, create=True).emitted[1]
    with pytest.raises(PublishError):
        TracingPublisher(Refusing(), tracer_provider=provider).publish(entry)
    (span,) = exporter.get_finished_spans()
    assert not span.status.is_ok and span.events[0].name == "exception"


def traced_round() -> tuple[TracerProvider, InMemorySpanExporter, list[OutboxMessage]]:
    """A tracer, and three entries of three aggregates, each stored in a handling span."""
    provider, exporter = tracer()
    store = AggregateStore(
        MemoryBackend(), Box, StoreConfig(observer=OtelStoreObserver(tracer_provider=provider))
    )
    entries = [
        store.handle(f"b{i}", Message(id=f"m{i}", type="Put"), handlers, create=True).emitted[1]
        for i in range(3)
    ]
    exporter.clear()
    return provider, exporter, entries


def refuse_second(entry: OutboxMessage) -> Exception | None:
    return PublishError("nack") if entry.aggregate_id == "b1" else None


@pytest.mark.parametrize("fail", [None, refuse_second])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_traced_round_has_a_span_per_entry_and_the_inner_outcomes(
    asynchronous: bool, fail: Any
) -> None:
    """A traced publisher keeps its publisher's rounds (``publish_many``): one span per
    entry, a sibling of the others and a child of the entry's stored context, whose own
    context the published entry carries; the outcomes are the inner publisher's, and a
    refused entry's span records its error."""
    provider, exporter, entries = traced_round()
    parents = [TraceContextTextMapPropagator().extract(e.headers) for e in entries]
    inner = MemoryPublisher(fail)
    if asynchronous:
        traced: Any = AsyncTracingPublisher(AsyncMemoryPublisher(inner), tracer_provider=provider)
        assert isinstance(traced, AsyncPipelinedPublisher)
        outcomes = loopless.run(traced.publish_many(entries))
    else:
        traced = TracingPublisher(inner, tracer_provider=provider)
        assert isinstance(traced, PipelinedPublisher)
        outcomes = traced.publish_many(entries)
    refused = [fail is not None and e.aggregate_id == "b1" for e in entries]
    assert [isinstance(o, PublishError) for o in outcomes] == refused
    assert [o is None for o in outcomes] == [not r for r in refused]
    spans = exporter.get_finished_spans()
    assert [s.attributes["messaging.message.id"] for s in spans if s.attributes] == [
        e.id for e in entries
    ]
    for span, parent, failed, outcome in zip(spans, parents, refused, outcomes, strict=True):
        stored = trace.get_current_span(parent).get_span_context()
        assert span.parent is not None and span.parent.span_id == stored.span_id
        assert span.status.is_ok is not failed
        assert [e.name for e in span.events] == (["exception"] if failed else [])
        if failed:
            assert span.status.description == f"PublishError: {outcome}"
    sent = {e.id: e for e in inner.published}
    assert sorted(sent) == sorted(e.id for e, r in zip(entries, refused, strict=True) if not r)
    for span in spans:
        message_id = span.attributes["messaging.message.id"] if span.attributes else None
        if message_id in sent:
            assert f"{span.context.span_id:016x}" in sent[message_id].headers["traceparent"]


def test_a_round_that_raises_ends_every_span_with_its_error() -> None:
    provider, exporter, entries = traced_round()

    class Broken(MemoryPublisher):
        def publish_many(self, entries: Any) -> list[Exception | None]:
            raise PublishError("connection lost")

    with pytest.raises(PublishError, match="connection lost"):
        TracingPublisher(Broken(), tracer_provider=provider).publish_many(entries)  # type: ignore[attr-defined]
    spans = exporter.get_finished_spans()
    assert len(spans) == 3 and not any(s.status.is_ok for s in spans)


def test_a_reply_short_of_outcomes_is_returned_as_is_and_ends_every_span() -> None:
    """The dispatcher refuses a reply of the wrong length itself; the spans still end,
    those without an outcome in error."""
    provider, exporter, entries = traced_round()

    class Short(MemoryPublisher):
        def publish_many(self, entries: Any) -> list[Exception | None]:
            return [None]

    traced: Any = TracingPublisher(Short(), tracer_provider=provider)
    assert traced.publish_many(entries) == [None]
    spans = exporter.get_finished_spans()
    assert [s.status.is_ok for s in spans] == [True, False, False]


def test_a_publisher_without_rounds_is_traced_without_rounds() -> None:
    class Single:
        def publish(self, entry: Any) -> None:
            return None

    assert not isinstance(TracingPublisher(Single()), PipelinedPublisher)


def test_store_conflicts_and_retries_are_counted() -> None:
    registry_observer = PrometheusStoreObserver()
    reader = InMemoryMetricReader()
    otel = OtelStoreObserver(
        tracer_provider=TracerProvider(resource=QUIET),
        meter_provider=MeterProvider(metric_readers=[reader], resource=QUIET),
    )
    backend = MemoryBackend()
    for observer in (registry_observer, otel):
        a = AggregateStore(backend, Box, StoreConfig(observer=observer))
        b = AggregateStore(backend, Box, StoreConfig(observer=observer))
        a.handle("c", Message(id=f"x{id(observer)}", type="Put"), handlers, create=True)
        b.handle("c", Message(id=f"y{id(observer)}", type="Put"), handlers)
        assert a.handle("c", Message(id=f"z{id(observer)}", type="Put"), handlers).attempts == 2
    assert registry_observer.conflicts.labels("Box")._value.get() == 1
    assert registry_observer.retries.labels("Box", "conflict")._value.get() == 1
    data = reader.get_metrics_data()
    assert data is not None
    names = {
        m.name: sum(p.value for p in m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert names["docoutbox.store.conflicts"] == 1 and names["docoutbox.store.retries"] == 1


def _doc(aggregate_id: str, partition: int, *ages: tuple[str, float], now: datetime) -> Any:
    outbox = [{"type": t, "created_at": now - timedelta(seconds=age)} for t, age in ages]
    return {"_id": aggregate_id, "partition": partition, "outbox": outbox}


def test_summarize_counts_per_partition_and_type() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    docs = [
        _doc("a", 0, ("X", 5), ("Y", 1), now=now),
        _doc("b", 1, ("X", 30), now=now),
        {"_id": "c", "partition": 1, "outbox": []},
    ]
    stats = summarize(docs, now)
    assert (stats.entries, stats.aggregates, stats.oldest_age) == (3, 2, 30.0)
    assert stats.by_type["X"].entries == 2 and stats.by_type["X"].aggregates == 2
    assert stats.by_partition[0].oldest_age == 5.0 and stats.by_partition[1].entries == 1
    assert summarize([], now).oldest_age == 0.0


def test_the_backend_probe_pages_through_every_pending_document() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Box)
    for n in range(7):
        store.handle(f"b{n}", Message(id=f"m{n}", type="Put"), handlers, create=True)
    stats = probe_backend(backend, page=3)()
    assert (stats.entries, stats.aggregates) == (14, 7)


def test_progress_reports_backlog_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    progress = ProgressMetrics(every=10, monotonic=lambda: clock[0])
    store = AggregateStore(MemoryBackend(), Box)
    entry = store.handle("b", Message(id="m", type="Put"), handlers, create=True).emitted[0]
    for _ in range(50):
        progress.published(entry, 0.1)
    clock[0] = 10.0
    now = MEASURED
    stats = OutboxStats(100, 10, 3.0, now, now)
    monitor = BacklogMonitor(lambda: stats, Fanout(progress))
    with caplog.at_level(logging.INFO, "docoutbox.metrics"):
        monitor.measure()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress")]
    assert "backlog_entries=100" in line and "rate_per_s=5.0" in line and "eta_s=20" in line


def test_a_failed_measurement_keeps_the_last_figures() -> None:
    results: list[Any] = [OutboxStats(1, 1, 0.0, None, MEASURED)]

    def probe() -> OutboxStats:
        if not results:
            raise TransientStoreError("down")
        value: OutboxStats = results.pop()
        return value

    monitor = BacklogMonitor(probe, ProgressMetrics())
    assert monitor.measure() is not None and monitor.measure() is None
    assert monitor.last is not None and monitor.last.entries == 1 and monitor.failures == 1


def test_stream_lag_is_measured_from_the_last_write() -> None:
    now = MEASURED
    assert stream_lag({"updated_at": now - timedelta(seconds=2)}, now) == 2.0
    assert stream_lag({}, now) is None


def test_otel_gauges_report_the_last_measurement() -> None:
    reader = InMemoryMetricReader()
    metrics = OtelMetrics(meter_provider=MeterProvider(metric_readers=[reader], resource=QUIET))
    metrics.outbox(OutboxStats(12, 4, 7.5, None, MEASURED))
    metrics.stream_lag(0.25)
    data = reader.get_metrics_data()
    assert data is not None
    values = {
        m.name: [p.value for p in m.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert values["docoutbox.outbox.depth"] == [12]
    assert values["docoutbox.outbox.aggregates"] == [4]
    assert values["docoutbox.outbox.oldest_age"] == [7.5]
    assert values["docoutbox.stream.lag"] == [0.25]


def test_json_logs_are_one_object_per_line_with_fields_and_masked() -> None:
    stream = io.StringIO()
    handler = logs.configure("INFO", secrets=["hunter2"], stream=stream, fmt="json")
    try:
        logging.getLogger("docoutbox.test").info("thing_done n=%d uri=%s", 3, "amqp://u:hunter2@h")
    finally:
        logging.getLogger().removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["event"] == "thing_done" and line["n"] == "3" and line["level"] == "INFO"
    assert "hunter2" not in stream.getvalue()


def test_plain_messages_and_entries_both_decode() -> None:
    plain = decode_message(b'{"id": "p1", "type": "Ping", "payload": {"a": 1}, "other": 2}')
    assert (plain.id, plain.type, plain.payload, plain.source) == ("p1", "Ping", {"a": 1}, None)
    store = AggregateStore(MemoryBackend(), Box)
    entry = store.handle("b", Message(id="m", type="Put"), handlers, create=True).emitted[0]
    message = decode_message(encode_entry(entry))
    assert (message.id, message.source, message.seq) == (entry.id, "Box/b", 1)
    for bad in (b"[1]", b"nope", b'{"type": "Ping"}'):
        with pytest.raises(InvalidMessage):
            decode_message(bad)


def test_a_failing_handler_is_retried_immediately_then_with_backoff() -> None:
    calls: list[int] = []
    sleeps: list[float] = []
    flaky: Handlers[Box] = Handlers()

    @flaky.on("Put")
    def flaky_put(state: Box, message: Message) -> Box:
        calls.append(1)
        if len(calls) < 4:
            raise RuntimeError("not yet")
        return Box(n=state.n + 1)

    store = AggregateStore(MemoryBackend(), Box)
    body = b'{"id": "p1", "type": "Put"}'
    retry = HandlerRetry(immediate=2, delayed=3, base_delay=0.1, max_delay=1.0)
    verdict = receive_retrying(
        body, store, flaky, lambda m: "b", create=True, retry=retry, sleep=sleeps.append
    )
    assert verdict.action is Action.ACK and verdict.attempts == 4 and len(calls) == 4
    assert len(sleeps) == 1 and 0.05 <= sleeps[0] <= 0.1  # two immediate, then one delayed
    assert store.get("b").state.n == 1

    calls.clear()
    verdict = receive_retrying(
        b'{"id": "p2"}', store, flaky, lambda m: "b", create=True, retry=retry, sleep=sleeps.append
    )
    assert verdict.action is Action.REJECT and verdict.attempts == 1  # invalid: no retry


def test_the_wire_server_helper_ships_in_the_package_and_says_how_to_install(
    tmp_path: Any,
) -> None:

    assert mongo_server.LAUNCHER.is_file() and mongo_server.POM.is_file()
    reason = mongo_server.mongo_wire_server_available(tmp_path)
    assert reason is not None
    assert "python -m docoutbox.testing.mongo_server install" in reason or "java" in reason
    with pytest.raises(RuntimeError, match="cannot start"):
        mongo_server.MongoWireServer(lib=tmp_path).start()


def test_the_memory_dead_letters_keep_consumer_rejects_too() -> None:

    letters: Rejects = MemoryDeadLetters()
    letters.put(None, {"id": "p1"}, "boom", 3, origin="consume", queue="q", body="{}")
    kept = letters.entries["p1"]  # type: ignore[attr-defined]
    assert (kept["origin"], kept["queue"], kept["attempts"]) == ("consume", "q", 3)
