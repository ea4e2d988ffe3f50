"""One trace, through a real OpenTelemetry SDK, from an incoming message to the consumer.

upstream span -> ``process Place`` (order o1 commits, its entry stores the context)
-> ``publish Event`` (the dispatcher, from the stored context) -> ``process Event`` (the
consumer commits on the ledger: a second aggregate). Wire server and RabbitMQ.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from benchmarks.ledger import Ledger, by_source, ledger_handlers
from benchmarks.rabbit import Sandbox
from docoutbox import AggregateStore, InboxPolicy, Message, StoreConfig
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.backlog import BacklogMonitor
from docoutbox.observability.otel import OtelMetrics, OtelStoreObserver, TracingPublisher
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.admin import outbox_stats
from docoutbox_mongo.kit import open_kit
from docoutbox_rabbitmq import RabbitConsumer, RabbitPublisher
from tests.integration.test_admin import Order, order_handlers

pytestmark = [pytest.mark.wire, pytest.mark.rabbitmq]


def metric_points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    points: dict[str, Any] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    return points


def test_one_trace_from_the_incoming_message_through_commit_publish_and_consume(
    mongo: Any, mongo_uri: str, box: Sandbox
) -> None:
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    observer = OtelStoreObserver(tracer_provider=tracing, meter_provider=meters)
    _, queue, _ = box.names(exchange=False)
    with RabbitPublisher(box.url) as declaring:
        declaring.declare(queues={queue: []})

    # The incoming message carries its producer's context.
    carrier: dict[str, str] = {}
    with tracing.get_tracer("upstream").start_as_current_span("upstream") as upstream:
        TraceContextTextMapPropagator().inject(carrier)
    orders = AggregateStore(MongoBackend(mongo["orders"]), Order, StoreConfig(observer=observer))
    incoming = Message(id="m1", type="Place", payload={"emit": ["Event"]}, headers=carrier)
    outcome = orders.handle("o1", incoming, order_handlers, create=True)
    (stored,) = orders.get("o1").outbox
    assert stored.headers["traceparent"] == outcome.emitted[0].headers["traceparent"]

    # A conflict: a second store writes o1 behind the first one's cached copy.
    other = AggregateStore(MongoBackend(mongo["orders"]), Order, StoreConfig(observer=observer))
    other.handle("o1", Message(id="m2", type="Place"), order_handlers)
    assert orders.handle("o1", Message(id="m3", type="Place"), order_handlers).attempts == 2

    target = open_kit(mongo_uri, mongo.name, "orders")
    dispatch_metrics = OtelMetrics(meter_provider=meters)
    monitor = BacklogMonitor(lambda: outbox_stats(mongo["orders"]), dispatch_metrics)
    assert monitor.measure() is not None
    depth = metric_points(reader)["docoutbox.outbox.depth"]
    assert [p.value for p in depth] == [1]

    # The publisher names its system, exchange and routing key (RabbitMQ's conventions).
    publisher = TracingPublisher(
        RabbitPublisher(box.url, routing_key=queue), tracer_provider=tracing
    )
    dispatcher = Dispatcher(
        target.backend,
        publisher,
        target.dead_letters,
        source=target.source,
        checkpoints=target.checkpoints,
        config=DispatcherConfig(name=f"otel-{uuid.uuid4().hex[:6]}", grace=0),
        metrics=dispatch_metrics,
    )
    thread = threading.Thread(target=dispatcher.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while orders.get("o1").outbox:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        dispatcher.stop()
        thread.join()
        publisher.close()
        target.close()

    ledger = AggregateStore(
        MongoBackend(mongo["ledger"]),
        Ledger,
        StoreConfig(inbox=InboxPolicy(window=0, exact=True), observer=observer),
    )
    consumer = RabbitConsumer(
        box.url, queue, ledger, ledger_handlers, aggregate_id_of=by_source, create=True
    )
    try:
        stats = consumer.run(max_messages=1, idle_timeout=10)
    finally:
        consumer.close()
    assert stats.applied == 1

    spans = {
        (span.name, span.attributes["messaging.message.id"]): span
        for span in exporter.get_finished_spans()
        if span.name != "upstream"
    }
    process_order = spans["process Place", "m1"]
    publish = spans["publish amq.default", stored.id]
    process_ledger = spans["process Event", stored.id]
    trace_id = upstream.get_span_context().trace_id
    assert {s.context.trace_id for s in (process_order, publish, process_ledger)} == {trace_id}
    assert process_order.parent.span_id == upstream.get_span_context().span_id
    assert publish.parent.span_id == process_order.context.span_id
    assert process_ledger.parent.span_id == publish.context.span_id
    assert (process_order.kind, publish.kind, process_ledger.kind) == (
        SpanKind.CONSUMER,
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
    )
    assert f"{process_order.context.span_id:016x}" in stored.headers["traceparent"]
    assert publish.attributes["messaging.system"] == "rabbitmq"
    assert publish.attributes["messaging.destination.name"] == "amq.default"
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == queue
    assert process_order.attributes["messaging.system"] == "docoutbox"
    assert publish.attributes["messaging.operation.type"] == "send"
    assert publish.attributes["messaging.message.id"] == stored.id
    assert process_ledger.attributes["messaging.operation.type"] == "process"
    assert process_ledger.attributes["docoutbox.aggregate.id"] == "Order/o1"

    points = metric_points(reader)
    assert sum(p.value for p in points["docoutbox.store.conflicts"]) == 1
    assert sum(p.value for p in points["docoutbox.store.retries"]) == 1
    assert sum(p.value for p in points["docoutbox.published"]) == 1
    (latency,) = points["docoutbox.publish.latency"]
    assert latency.count == 1 and latency.sum >= 0
