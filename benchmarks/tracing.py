"""Benchmark 8: the cost of OpenTelemetry tracing, as ratios against tracing off.

Every span is sampled and goes through the SDK's ``BatchSpanProcessor`` to an exporter
that drops it, so the figures include span creation, attributes, context propagation
and the processor's queue, but no network.

- ``handle``: ``store.handle`` with ``StoreConfig(observer=OtelStoreObserver(...))``
  (a ``process`` span, the trace context injected into each emitted entry) against the
  same store without an observer, on the wire server and on the in-memory testing backend
  (no network, but it deep-copies every document it reads or writes);
- ``dispatch``: the dispatcher draining a backlog through ``TracingPublisher`` (a
  ``publish`` span per entry, continued from the stored context) against the bare
  publisher; and the publish call alone, in memory.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.common import (
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    ratio_range,
    timed_rate,
)
from benchmarks.dispatch import TIMEOUT, TimedPublisher, _wait, backlog
from benchmarks.store import Variant, _store_handle, _trimmer
from benchmarks.workload import Account, Feed, account_ids, create_accounts, handlers
from docoutbox import AggregateStore, StoreConfig
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.observability.otel import OtelStoreObserver, TracingPublisher
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.changes import MongoChangeSource


class DroppingExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def provider() -> tuple[TracerProvider, DroppingExporter]:
    exporter = DroppingExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(BatchSpanProcessor(exporter))
    return tracing, exporter


def _memory_trimmer(store: AggregateStore[Any], accounts: list[str]) -> Callable[[], None]:
    def trim() -> None:
        for account in accounts:
            store.trim(account, [entry.id for entry in store.get(account).outbox])

    return trim


def _handle_ratio(
    scale: Scale, on_backend: Any, off_backend: Any, accounts: list[str], tracing: TracerProvider
) -> tuple[list[float], list[float]]:
    """Between rounds (untimed) every outbox is emptied, as a dispatcher keeping up would."""
    traced = AggregateStore(
        on_backend, Account, StoreConfig(observer=OtelStoreObserver(tracer_provider=tracing))
    )
    plain = AggregateStore(off_backend, Account)

    def trimmer(store: AggregateStore[Any]) -> Callable[[], None]:
        if isinstance(store.backend, MongoBackend):
            return _trimmer(store.backend.collection)
        return _memory_trimmer(store, accounts)

    variants = {
        "on": Variant(
            _store_handle(traced), Feed(accounts, emit=True), scale, before=trimmer(traced)
        ),
        "off": Variant(
            _store_handle(plain), Feed(accounts, emit=True), scale, before=trimmer(plain)
        ),
    }
    samples = interleaved(
        {name: v.round for name, v in variants.items()}, scale.rounds, scale.warmup
    )
    return samples["on"], samples["off"]


def _drain(client: Any, entries: int, tracing: TracerProvider | None) -> float:
    bench = backlog(client, entries, 1)
    timed = TimedPublisher()
    publisher: Any = timed if tracing is None else TracingPublisher(timed, tracer_provider=tracing)
    config, checkpoints = bench.resumed("bench-tracing")
    dispatcher = Dispatcher(
        MongoBackend(bench.coll),
        publisher,
        MemoryDeadLetters(),
        source=MongoChangeSource(bench.coll),
        checkpoints=checkpoints,
        config=config,
    )
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    began = time.perf_counter()
    thread.start()
    _wait(lambda: len(timed.at) >= entries)
    rate = entries / (max(timed.at.values()) - began)
    dispatcher.stop()
    thread.join(TIMEOUT)
    ids = timed.ids()
    if len(ids) != entries or set(ids) != set(bench.committed):
        raise AssertionError(f"published {len(ids)} of {entries} entries")
    bench.coll.drop()
    return rate


def _progress(stage: str) -> None:
    print(f"[bench] tracing: {stage} measured", file=sys.stderr, flush=True)


def run(uri: str, scale: Scale) -> Table:
    tracing, exporter = provider()
    client = connect(uri)
    table = Table(
        "tracing",
        "OpenTelemetry tracing on vs off (ratio of throughputs; 1.00 = no cost)",
        ["what", "tracing off (ops/s)", "tracing on (ops/s)", "on / off", "IQR"],
    )
    try:
        accounts = account_ids(scale.aggregates)
        on_coll, off_coll = new_collection(client, "trace_on"), new_collection(client, "trace_off")
        create_accounts(on_coll, accounts)
        create_accounts(off_coll, accounts)
        on, off = _handle_ratio(
            scale, MongoBackend(on_coll), MongoBackend(off_coll), accounts, tracing
        )
        table.add("handle, wire server", median(off), median(on), paired_ratio(on, off),
                  "{:.2f}-{:.2f}".format(*ratio_range(on, off)))  # fmt: skip
        table.figures["handle_wire"] = {"ratio": paired_ratio(on, off), "on": on, "off": off}
        _progress("handle_wire")
        on_coll.drop()
        off_coll.drop()

        memory_on, memory_off = MemoryBackend(), MemoryBackend()
        for backend in (memory_on, memory_off):
            setup = AggregateStore(backend, Account)
            for account in accounts:
                setup.create(account, Account())
        mem_scale = Scale(messages=scale.messages * 10, rounds=scale.rounds, warmup=scale.warmup)
        on, off = _handle_ratio(mem_scale, memory_on, memory_off, accounts, tracing)
        table.add("handle, in memory", median(off), median(on), paired_ratio(on, off),
                  "{:.2f}-{:.2f}".format(*ratio_range(on, off)))  # fmt: skip
        table.figures["handle_memory"] = {"ratio": paired_ratio(on, off), "on": on, "off": off}
        _progress("handle_memory")

        entries = max(10, scale.dispatch_entries // 2)
        rounds = max(1, min(scale.rounds, 9))
        samples = interleaved(
            {
                "on": lambda: _drain(client, entries, tracing),
                "off": lambda: _drain(client, entries, None),
            },
            rounds,
            0,
        )
        on, off = samples["on"], samples["off"]
        table.add("dispatch drain, wire server", median(off), median(on),
                  paired_ratio(on, off), "{:.2f}-{:.2f}".format(*ratio_range(on, off)))  # fmt: skip
        table.figures["dispatch_wire"] = {"ratio": paired_ratio(on, off), "on": on, "off": off}
        _progress("dispatch_wire")

        store = AggregateStore(MemoryBackend(), Account)
        entry = store.handle(
            "a", {"id": "m", "type": "Deposit", "payload": {"n": 1, "emit": True}}, handlers,
            create=True,
        ).emitted[0]  # fmt: skip
        observed = StoreConfig(observer=OtelStoreObserver(tracer_provider=tracing))
        traced_store = AggregateStore(MemoryBackend(), Account, observed)
        traced_entry = traced_store.handle(
            "a", {"id": "m", "type": "Deposit", "payload": {"n": 1, "emit": True}}, handlers,
            create=True,
        ).emitted[0]  # fmt: skip
        bare, wrapped = (
            MemoryPublisher(),
            TracingPublisher(MemoryPublisher(), tracer_provider=tracing),
        )
        count = scale.messages * 20

        def publish_bare() -> float:
            bare.published.clear()

            def work() -> None:
                for _ in range(count):
                    bare.publish(entry)

            return timed_rate(count, work)

        def publish_traced() -> float:
            inner: Any = wrapped.inner
            inner.published.clear()

            def work() -> None:
                for _ in range(count):
                    wrapped.publish(traced_entry)

            return timed_rate(count, work)

        samples = interleaved(
            {"on": publish_traced, "off": publish_bare}, scale.rounds, scale.warmup
        )
        on, off = samples["on"], samples["off"]
        table.add("publish call alone, in memory", median(off), median(on),
                  paired_ratio(on, off), "{:.2f}-{:.2f}".format(*ratio_range(on, off)))  # fmt: skip
        table.figures["publish_memory"] = {
            "ratio": paired_ratio(on, off),
            "on": on,
            "off": off,
            "added_us": 1e6 * (1 / median(on) - 1 / median(off)),
        }
        _progress("publish_memory")
    finally:
        tracing.shutdown()
        client.close()
    table.notes += [
        "Ratios are medians of per-round on/off ratios, variants interleaved in the same run.",
        f"Spans exported (and dropped): {exporter.exported}; sampler: always on.",
        "handle: Deposit messages that emit one entry each, on warm cached aggregates; "
        "every outbox is emptied between rounds (untimed).",
        f"dispatch: drain of {max(10, scale.dispatch_entries // 2)} entries, one per "
        "aggregate, followed by the change stream; rate = entries / time to the last publish.",
        "publish call alone: an in-memory publisher that only appends to a list, so the "
        "ratio is the span's cost against nearly nothing; "
        f"{table.figures['publish_memory']['added_us']:.0f} us added per publish.",
    ]
    return table
