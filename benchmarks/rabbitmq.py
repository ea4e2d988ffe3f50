"""Benchmark: dispatch throughput to RabbitMQ against a raw aio-pika loop publishing the same
records with their confirms in flight, in the same run, on the same broker.

- raw pipelined-confirm loop (baseline): the records the dispatcher published (same
  exchange, routing key, body and properties: persistent, ``mandatory``), published by
  aio-pika on one confirm-mode channel, every publish sent before the first confirm is
  awaited: the broker and client ceiling;
- raw loop, one entry per aggregate in flight: the same records on the same channel, one
  task per aggregate publishing its entries in ``seq`` order, each after the previous
  one's confirm (what I4 under nacks allows a dispatcher): the ceiling of that rule, with
  every aggregate in flight at once;
- raw lean loop: the same records in one round of ``AsyncRabbitPublisher.publish_many``
  (frames written at once, confirms settled into the round): the publish path the
  dispatchers below use, without them; far cheaper per entry than aio-pika's own
  ``Exchange.publish``, so it is a ceiling too;
- Dispatcher -> RabbitMQ, threads: the threaded dispatcher with pika's
  ``RabbitPublisher`` (one connection per worker thread; a publish round goes out one
  entry at a time per thread, pika waits for each confirm);
- Dispatcher -> RabbitMQ, threads, pipelined: the threaded dispatcher with
  ``PipelinedRabbitPublisher`` (``AsyncRabbitPublisher`` on a loop thread of its own:
  every worker's rounds on one channel, each written whole before its confirms are
  awaited);
- AsyncDispatcher -> RabbitMQ: the asyncio dispatcher with ``AsyncRabbitPublisher``
  (each publish round's frames written at once, then its confirms awaited);
- the same two dispatchers -> memory: each driver's own ceiling on this server.

Every dispatcher follows the change stream of the wire server from a backlog of commits
made first (1 or 10 pending entries per aggregate), resuming from a checkpoint before
them; it is timed from its start until the last entry is confirmed. The broker is the
shared one of ``scripts/servers.sh start-rabbitmq`` (``$DOCOUTBOX_RABBITMQ_URL``); the
benchmark declares its own exchange and durable queue, purges the queue after each
variant and deletes both at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import aio_pika

from benchmarks.common import (
    Scale,
    Table,
    add_ceiling_rows,
    against_ceilings,
    connect,
    cpu_medians,
    interleaved,
)
from benchmarks.dispatch import (
    DispatchReader,
    TimedPublisher,
    Workbench,
    backlog,
    timed_drain,
)
from benchmarks.rabbit import Sandbox, rabbitmq_available, rabbitmq_url
from docoutbox import OutboxMessage
from docoutbox.codec import WireFormat
from docoutbox_rabbitmq import RabbitPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.amqp import message_for
from docoutbox_rabbitmq.pipelined import PipelinedRabbitPublisher

DENSITIES = (1, 10)
ROUNDS = 5
#: The variants, per density: the raw loops and the dispatchers (baseline first).
KINDS = [
    "raw",
    "raw-per-aggregate",
    "raw-lean",
    "threads",
    "threads-pipelined",
    "async",
    "threads-memory",
    "async-memory",
]


class ConfirmedRabbit(RabbitPublisher):
    """pika's publisher, noting each confirmed entry (and when) in ``stamps``."""

    def __init__(self, url: str, exchange: str, stamps: TimedPublisher) -> None:
        super().__init__(url, exchange)
        self.stamps = stamps

    def publish(self, entry: OutboxMessage) -> None:
        super().publish(entry)
        self.stamps.publish(entry)


class ConfirmedPipelinedRabbit(PipelinedRabbitPublisher):
    """The threads' pipelined publisher, noting each confirmed entry in ``stamps``."""

    def __init__(self, url: str, exchange: str, stamps: TimedPublisher) -> None:
        super().__init__(url, exchange)
        self.stamps = stamps

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        outcomes = super().publish_many(entries)
        for entry, outcome in zip(entries, outcomes, strict=True):
            if outcome is None:
                self.stamps.publish(entry)
        return outcomes


class ConfirmedAsyncRabbit(AsyncRabbitPublisher):
    """aio-pika's publisher, noting each confirmed entry (and when) in ``stamps``."""

    def __init__(self, url: str, exchange: str, stamps: TimedPublisher) -> None:
        super().__init__(url, exchange)
        self.stamps = stamps

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        outcomes = await super().publish_many(entries)
        for entry, outcome in zip(entries, outcomes, strict=True):
            if outcome is None:
                self.stamps.publish(entry)
        return outcomes


class RabbitDispatch(DispatchReader):
    """The benchmark's dispatcher (as :class:`DispatchReader`), publishing to RabbitMQ."""

    def __init__(
        self, bench: Workbench, kind: str, url: str, exchange: str, *, pipelined: bool = False
    ) -> None:
        self.url, self.exchange, self.pipelined = url, exchange, pipelined
        self.sync: ConfirmedRabbit | ConfirmedPipelinedRabbit | None = None
        super().__init__(bench, kind)

    def _sync_publisher(self) -> Any:
        made = ConfirmedPipelinedRabbit if self.pipelined else ConfirmedRabbit
        self.sync = made(self.url, self.exchange, self.publisher)
        return self.sync

    def _async_publisher(self) -> Any:
        return ConfirmedAsyncRabbit(self.url, self.exchange, self.publisher)

    async def _close_async(self, publisher: Any) -> None:
        await publisher.close()

    def finish(self) -> None:
        super().finish()
        if self.sync is not None:
            self.sync.close()


def raw_loop(
    url: str,
    exchange: str,
    entries: list[OutboxMessage],
    cpu: list[float] | None = None,
    *,
    per_aggregate: bool = False,
) -> float:
    """Publish every record on one confirm-mode channel, all confirms in flight; or
    (``per_aggregate``) one aggregate's records one after another, each once the previous
    one is confirmed, every aggregate at once. A given ``cpu`` receives the client CPU per
    record in µs."""

    async def main() -> float:
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            target = await channel.get_exchange(exchange, ensure=False)

            async def publish(entry: OutboxMessage) -> None:
                body, fields = message_for(entry, WireFormat.PLAIN)
                message = aio_pika.Message(body, **fields)
                await target.publish(message, entry.type, mandatory=True)

            async def in_turn(run: list[OutboxMessage]) -> None:
                for entry in run:
                    await publish(entry)

            cpu_began = time.process_time()
            began = time.perf_counter()
            if per_aggregate:
                runs: dict[Any, list[OutboxMessage]] = {}
                for entry in sorted(entries, key=lambda e: e.seq or 0):
                    runs.setdefault(entry.aggregate_id, []).append(entry)
                await asyncio.gather(*(in_turn(run) for run in runs.values()))
            else:
                await asyncio.gather(*(publish(entry) for entry in entries))
            rate = len(entries) / (time.perf_counter() - began)
            if cpu is not None:
                cpu.append((time.process_time() - cpu_began) / len(entries) * 1e6)
            return rate
        finally:
            await connection.close()

    return asyncio.run(main())


def lean_loop(
    url: str, exchange: str, entries: list[OutboxMessage], cpu: list[float] | None = None
) -> float:
    """Publish every record in one round of ``AsyncRabbitPublisher.publish_many`` (its
    frames written at once, the confirms settled into the round), connected first. A
    given ``cpu`` receives the client CPU per record in µs."""

    async def main() -> float:
        async with AsyncRabbitPublisher(url, exchange) as publisher:
            await publisher.check()  # connected, channel open
            cpu_began = time.process_time()
            began = time.perf_counter()
            outcomes = await publisher.publish_many(entries)
            rate = len(entries) / (time.perf_counter() - began)
            if cpu is not None:
                cpu.append((time.process_time() - cpu_began) / len(entries) * 1e6)
        assert outcomes == [None] * len(entries), [o for o in outcomes if o][:3]
        return rate

    return asyncio.run(main())


def dispatcher(
    client: Any,
    url: str,
    exchange: str,
    entries: int,
    density: int,
    kind: str,
    sink: list[OutboxMessage] | None = None,
    cpu: list[float] | None = None,
) -> float:
    """Dispatch ``entries`` fresh commits with the ``kind`` driver (one of :data:`KINDS`
    but the raw loops); a given ``sink`` receives what was published, a given ``cpu``
    the client CPU per entry in µs."""
    bench = backlog(client, entries, density)
    driver = "async" if kind.startswith("async") else "dispatcher"
    reader = (
        DispatchReader(bench, driver)
        if kind.endswith("memory")
        else RabbitDispatch(bench, driver, url, exchange, pipelined=kind.endswith("pipelined"))
    )
    rate = timed_drain(reader, entries, cpu)
    if sink is not None:
        sink.extend(reader.publisher.published)
    return rate


def broker() -> str:
    """The benchmarks' RabbitMQ URL; exits saying how to start it if it is down."""
    url = rabbitmq_url()
    reason = rabbitmq_available(url)
    if reason is not None:
        raise SystemExit(f"{reason}; run scripts/servers.sh start-rabbitmq")
    return url


def run(uri: str, scale: Scale) -> Table:
    url = broker()
    client = connect(uri)
    box = Sandbox(url)
    entries = scale.dispatch_entries
    rounds = min(scale.rounds, ROUNDS)
    samples: dict[int, dict[str, list[float]]] = {}
    cpu: dict[int, dict[str, list[float]]] = {}
    try:
        exchange, queue, _ = box.names()
        box.channel.exchange_declare(exchange, "topic", durable=True)
        box.channel.queue_declare(queue, durable=True)
        box.channel.queue_bind(queue, exchange, "#")

        def purged(variant: Callable[[], float]) -> float:
            try:
                return variant()
            finally:
                box.channel.queue_purge(queue)

        for density in DENSITIES:
            records: list[OutboxMessage] = []
            # The records, and a warm-up of the broker, the server and the dispatcher.
            purged(partial(dispatcher, client, url, exchange, entries, density, "async", records))
            assert len(records) == entries, (len(records), entries)
            used = cpu[density] = {kind: [] for kind in KINDS}
            plan: dict[str, Callable[[], float]] = {
                "raw": partial(raw_loop, url, exchange, records, used["raw"]),
                "raw-per-aggregate": partial(
                    raw_loop, url, exchange, records, used["raw-per-aggregate"], per_aggregate=True
                ),
                "raw-lean": partial(lean_loop, url, exchange, records, used["raw-lean"]),
            }
            for kind in KINDS[3:]:
                plan[kind] = partial(
                    dispatcher, client, url, exchange, entries, density, kind, cpu=used[kind]
                )
            samples[density] = interleaved(
                {name: partial(purged, work) for name, work in plan.items()},
                rounds,
                scale.warmup,
            )
    finally:
        box.close()
        client.drop_database("docoutbox_bench")
        client.close()
    warmup = scale.warmup
    return _table(samples, {d: cpu_medians(c, warmup) for d, c in cpu.items()}, entries, rounds)


LABELS = {
    "raw": "raw aio-pika loop, confirms in flight",
    "raw-per-aggregate": "raw aio-pika loop, one entry per aggregate in flight",
    "raw-lean": "raw lean loop: one AsyncRabbitPublisher.publish_many round",
    "threads": "Dispatcher (threads) -> RabbitPublisher (pika)",
    "threads-pipelined": "Dispatcher (threads) -> PipelinedRabbitPublisher (own AMQP connection)",
    "async": "AsyncDispatcher -> AsyncRabbitPublisher (own AMQP connection)",
    "threads-memory": "Dispatcher (threads) -> memory",
    "async-memory": "AsyncDispatcher -> memory",
}
#: Each dispatcher's ceiling on this server: the same driver publishing to memory.
MEMORY = {
    "threads": "threads-memory",
    "threads-pipelined": "threads-memory",
    "async": "async-memory",
}


def _table(
    samples: dict[int, dict[str, list[float]]],
    cpu: dict[int, dict[str, float]],
    entries: int,
    rounds: int,
) -> Table:
    table = Table(
        "rabbitmq",
        "Dispatch throughput to RabbitMQ vs a raw aio-pika loop with confirms in flight",
        [
            "entries per aggregate",
            "variant",
            "entries/s",
            "vs raw loop",
            "vs same driver -> memory",
            "vs the lower ceiling",
            "additive bound",
            "client CPU µs/entry",
        ],
    )
    add_ceiling_rows(table, samples, cpu, LABELS, MEMORY)
    lean = []
    for density, by_kind in samples.items():
        figures = table.figures[f"per_aggregate_{density}"]
        for name, memory in MEMORY.items():
            found = against_ceilings(by_kind[name], by_kind["raw-lean"], by_kind[memory])
            figures[name]["ratio_to_lower_ceiling_lean"] = found["ratio_to_lower_ceiling"]
            lean.append(f"{density} per aggregate, {name}: {found['ratio_to_lower_ceiling']:.2f}x")
    table.notes += [
        f"{entries:,} entries per round ({entries:,} or {entries // 10:,} aggregates), "
        f"{rounds} interleaved rounds per density after a warm-up, on the shared RabbitMQ "
        "3.10 broker of the same machine: one durable topic exchange and queue, "
        "persistent messages. Ratios are medians over rounds of the per-round ratio "
        "(interquartile range, or min-max below 4 rounds, in brackets). 'vs the lower "
        "ceiling' divides by the lower of the raw loop and the same driver -> memory in "
        "the same round (the goal is >= 0.8x); 'additive bound' is what adding the two "
        "ceilings' costs per entry on one interpreter allows: 1/(1/raw + 1/memory) over "
        "the lower one.",
        "'one entry per aggregate in flight' publishes the same records as the raw loop, "
        "each aggregate's in seq order, the next once the previous is confirmed, every "
        "aggregate at once: what first-delivery order under nacks (I4) leaves of the "
        "pipelining. 'client CPU' is this process's CPU time (every thread) per entry over "
        "the timed span, median over rounds: the database and the broker run apart.",
        "Against the lower of the raw lean loop (the publisher's own rounds, far cheaper "
        "per entry than aio-pika's Exchange.publish) and the same driver -> memory: "
        + "; ".join(lean)
        + ".",
        "Dispatchers are timed from start (connections included: pika opens one per "
        "worker thread) to the last confirm; every round checks that each entry was "
        "published and trimmed.",
    ]
    return table
