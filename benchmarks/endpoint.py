"""Benchmark: messages handled per second by an endpoint against a plain consumer loop.

The same deliveries (docoutbox entries of 20 producing aggregates, each handled on its
producer's ledger, exact de-duplication) are pre-filled into a fresh RabbitMQ queue and
consumed into a fresh collection of the wire server, in the same run:

- plain loop (baseline): aio-pika with prefetch 16, ``await store.handle`` per delivery
  on an ``AsyncAggregateStore`` over pymongo's ``AsyncMongoClient``, ack after the commit;
- consumer: ``AsyncRabbitConsumer`` alone (the endpoint's consumer, without its
  dispatcher), on the same kind of store;
- endpoint: :func:`docoutbox_app.endpoint.runtime.run_endpoint` on the same kind of store,
  i.e. ``AsyncRabbitConsumer`` (prefetch 16, handler retries, dead letters) beside the
  endpoint's leased dispatcher of the collection (idle: the handlers emit nothing) and its
  health. Its change stream brings nothing, so it reads it once a second
  (:data:`~docoutbox_app.endpoint.runtime.STREAM_WAIT`);
- endpoint, reading every 0.05 s: the same, its stream read every 0.05 s as before
  ``max_stream_wait`` (``DispatchOptions(max_stream_wait=0.05)``). On the wire server
  every read scans the whole oplog, which grows with every round;
- endpoint, sweeping: the same, its dispatcher sweeping every second instead of following
  the change stream (``DispatchOptions(poll_interval=1.0)``).

Each is timed from its first delivery applied once it runs to its last, and counts the
deliveries applied in between: the plain loop and the consumer from their first delivery
(connections left out); the endpoint, whose consumers start beside its dispatcher, from
the first delivery it applied once its dispatcher holds its leases and follows its stream
(the dispatcher's start-up left out: the partition check, lease taking, the stream's
opening and the fresh start's sweep, which a long-running endpoint pays once). That is the
steady rate of handling, the CPU time this process spent meanwhile per message (every
thread's: the endpoint's lease keeper and drivers too), which a loaded machine disturbs
much less than the rate, and the wire server's (from ``/proc``: the handling's commands
and the endpoint's stream reads, due queries and lease renewals alike; the two share the
machine's cores).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aio_pika
import pika

from benchmarks.common import (
    DATABASE,
    Scale,
    Table,
    interleaved,
    median,
    paired_ratio,
    ratio_range,
)
from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from benchmarks.rabbit import rabbitmq_url
from docoutbox import AsyncAggregateStore, InboxPolicy, StoreConfig
from docoutbox.codec import decode_message, encode_entry
from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.receive import ConsumerStats, Verdict
from docoutbox.testing import MemoryPublisher
from docoutbox_app.endpoint import Endpoint, RabbitQueue, Store
from docoutbox_app.endpoint.runtime import Observation, run_endpoint
from docoutbox_app.wiring import DispatchOptions
from docoutbox_mongo import open_async_kit
from docoutbox_rabbitmq.aio import AsyncRabbitConsumer

ROUNDS = 8
PRODUCERS = 20
PREFETCH = 16
EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))


def server_cpu() -> float:
    """CPU seconds used so far by the wire server this process started (its ``java``
    children, from ``/proc``); NaN where there is none (``$MONGODB_URI``) or no ``/proc``."""
    total, found, me = 0.0, False, str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, _, rest = stat.read_text().rpartition(")")
        except OSError:
            continue  # gone meanwhile
        fields = rest.split()
        if fields[1] == me and name.endswith("(java"):
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            found = True
    return total if found else math.nan


@dataclass(frozen=True)
class Measured:
    """One round of a contestant: messages per second, and CPU milliseconds per message
    of this process (every thread) and of the wire server; ``with_start``: timed from its
    first delivery, start-up included, since it was not running before its last one."""

    rate: float
    client_ms: float
    server_ms: float
    with_start: bool = False


Mark = tuple[float, float, float, int]


class Span:
    """From a delivery applied once the contestant runs to the last: the rate of the
    deliveries applied in between, and the CPU spent meanwhile per message."""

    def __init__(self) -> None:
        self.started: Mark | None = None
        #: At the first delivery, in case the contestant runs only after its last.
        self.early: Mark | None = None

    @staticmethod
    def _mark(applied: int) -> Mark:
        server = server_cpu()  # read outside the client's timed span
        return (time.perf_counter(), time.process_time(), server, applied)

    def begin(self, applied: int, *, running: bool = True) -> None:
        """``applied`` deliveries are applied so far (the first once running: 1)."""
        if self.started is not None:
            return
        if running:
            self.started = self._mark(applied)
        elif self.early is None:
            self.early = self._mark(applied)

    def end(self, applied: int) -> Measured:
        mark = self.started or self.early
        if mark is None or applied <= mark[3]:
            raise RuntimeError(f"too few deliveries to time: {applied}")
        wall, cpu, server, first = mark
        handled = applied - first
        rate = handled / (time.perf_counter() - wall)
        client_ms = (time.process_time() - cpu) * 1e3 / handled
        server_ms = (server_cpu() - server) * 1e3 / handled
        return Measured(rate, client_ms, server_ms, with_start=self.started is None)


def fill(url: str, count: int) -> str:
    """A fresh durable queue holding ``count`` entries, interleaved by producer."""

    queue = f"bench-endpoint-{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for n in range(count):
            entry = make_entry(f"p{n % PRODUCERS}", n // PRODUCERS + 1)
            channel.basic_publish("", queue, encode_entry(entry))
    return queue


def drop_queue(url: str, queue: str) -> None:

    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        connection.channel().queue_delete(queue)


async def plain(uri: str, url: str, queue: str, count: int) -> Measured:

    collection = f"endpoint_plain_{uuid.uuid4().hex[:8]}"
    span = Span()
    kit = await open_async_kit(uri, DATABASE, collection)
    store = AsyncAggregateStore(kit.backend, Ledger, EXACT)
    handled = 0
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        source = await channel.get_queue(queue, ensure=False)
        async with source.iterator() as deliveries:
            async for delivery in deliveries:
                message = decode_message(delivery.body)
                outcome = await store.handle(
                    by_source(message), message, ledger_handlers, create=True
                )
                assert outcome.applied
                await delivery.ack()
                handled += 1
                if handled == 1:
                    span.begin(handled)
                if handled == count:
                    break
        return span.end(count)
    finally:
        await connection.close()
        await kit.close()


async def consumer(uri: str, url: str, queue: str, count: int) -> Measured:

    collection = f"endpoint_consumer_{uuid.uuid4().hex[:8]}"
    kit = await open_async_kit(uri, DATABASE, collection)
    store = AsyncAggregateStore(kit.backend, Ledger, EXACT)
    span = Span()
    verdicts = [0]

    def first(verdict: Any, redelivered: bool) -> None:
        verdicts[0] += 1
        span.begin(verdicts[0])

    made = AsyncRabbitConsumer(
        url,
        queue,
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        creates={"Event"},
        prefetch=PREFETCH,
        on_verdict=first,
        dead_letters=kit.dead_letters,
    )
    try:
        stats = await made.run(max_messages=count, idle_timeout=30)
        measured = span.end(count)
        assert stats.applied == count, stats
        return measured
    finally:
        await made.close()
        await kit.close()


def ready(dispatchers: list[AsyncDispatcher]) -> bool:
    """Whether the endpoint's dispatcher runs: its leases taken, its stream open if it
    follows one (its fresh start's sweep is queued in the same turn)."""
    if not dispatchers or not dispatchers[0].started.is_set():
        return False
    return dispatchers[0].stream_open is not False


async def endpoint(
    uri: str,
    url: str,
    queue: str,
    count: int,
    poll_interval: float | None = None,
    max_stream_wait: float | None = None,
) -> Measured:

    collection = f"endpoint_run_{uuid.uuid4().hex[:8]}"
    made = Endpoint(
        "bench",
        Ledger,
        ledger_handlers,
        store=Store("mongo", uri, DATABASE, collection),
        inputs=[
            RabbitQueue(queue=queue, url=url, route=by_source, prefetch=PREFETCH, creates={"Event"})
        ],
        output=MemoryPublisher(),
        config=EXACT,
        dispatch=DispatchOptions(poll_interval=poll_interval, max_stream_wait=max_stream_wait),
    )
    observation = Observation()
    stop = asyncio.Event()
    span = Span()
    dispatchers: list[AsyncDispatcher] = []
    running = asyncio.create_task(
        run_endpoint(made, made.settings(), stop, observation, started=dispatchers.append)
    )
    label = made.inputs[0].label
    stats: ConsumerStats | None = None
    while stats is None:  # the consumer's counts appear before it connects
        health = observation.health.endpoints.get("bench")
        stats = health.stats.get(label) if health is not None else None
        if running.done():
            running.result()  # raises what stopped it
        await asyncio.sleep(0.001)
    counts, done = stats.count, asyncio.Event()

    def counted(verdict: Verdict, redelivered: bool) -> None:
        """The consumer counting a delivery (as the other contestants count theirs)."""
        counts(verdict, redelivered)
        assert stats is not None
        span.begin(stats.applied, running=ready(dispatchers))
        if stats.applied >= count:
            done.set()

    stats.count = counted  # type: ignore[method-assign]
    finished = asyncio.create_task(done.wait())
    await asyncio.wait([finished, running], return_when=asyncio.FIRST_COMPLETED)
    if not done.is_set():
        finished.cancel()
        running.result()  # raises what stopped it
        raise RuntimeError("the endpoint stopped before its last delivery")
    measured = span.end(count)
    stop.set()
    await running
    assert (stats.applied, stats.rejected) == (count, 0), stats
    return measured


def one(variant: Callable[..., Any], uri: str, url: str, count: int, cpu: list[Measured]) -> float:
    """One round of ``variant`` on a freshly filled queue: its rate (what it measured
    goes to ``cpu``)."""
    queue = fill(url, count)
    try:
        measured: Measured = asyncio.run(variant(uri, url, queue, count))
        cpu.append(measured)
        return measured.rate
    finally:
        drop_queue(url, queue)


def run(uri: str, scale: Scale) -> Table:
    url = rabbitmq_url()
    count = scale.dispatch_entries
    variants: dict[str, Callable[..., Any]] = {
        "plain": plain,
        "consumer": consumer,
        "endpoint": endpoint,
        "endpoint, reading every 0.05 s": partial(endpoint, max_stream_wait=0.05),
        "endpoint, sweeping": partial(endpoint, poll_interval=1.0),
    }
    cpu: dict[str, list[Measured]] = {name: [] for name in variants}
    plan = {name: partial(one, v, uri, url, count, cpu[name]) for name, v in variants.items()}
    rounds = min(scale.rounds, ROUNDS)
    load = os.getloadavg()[0]
    samples = interleaved(plan, rounds, scale.warmup)
    table = Table(
        "endpoint",
        "Endpoint consuming from RabbitMQ vs a plain consumer loop (same store.handle)",
        [
            "variant",
            "messages/s",
            "vs plain loop",
            "client CPU ms/msg",
            "CPU vs plain loop",
            "wire server CPU ms/msg",
        ],
    )
    used = {name: taken[-rounds:] for name, taken in cpu.items()}  # after the warm-up
    client = {name: [m.client_ms for m in taken] for name, taken in used.items()}
    for name in plan:
        low, high = ratio_range(samples[name], samples["plain"])
        ratio = paired_ratio(samples[name], samples["plain"])
        cpu_ratio = paired_ratio(client[name], client["plain"])
        server = median([m.server_ms for m in used[name]])
        table.add(
            name,
            median(samples[name]),
            f"{ratio:.2f}x ({low:.2f}-{high:.2f})",
            f"{median(client[name]):.3f}",
            f"{cpu_ratio:.2f}x",
            "n/a" if math.isnan(server) else f"{server:.3f}",
        )
        table.figures[name] = {
            "per_s": median(samples[name]),
            "ratio": ratio,
            "cpu_ms_per_message": median(client[name]),
            "cpu_ratio": cpu_ratio,
            "server_cpu_ms_per_message": None if math.isnan(server) else server,
        }
    early = {name: sum(m.with_start for m in taken) for name, taken in used.items()}
    for name, times in early.items():
        if times:
            table.notes.append(
                f"{name}: {times} round(s) of {rounds} timed from the first delivery, "
                "start-up included (its dispatcher was not running before the last one)."
            )
    table.notes += [
        f"{count:,} deliveries per round from a pre-filled queue of the local RabbitMQ, "
        f"{PRODUCERS} producing aggregates, prefetch {PREFETCH}, into a fresh collection of "
        "the wire server (AsyncMongoClient, exact de-duplication); timed from the first "
        "delivery applied once running (the endpoint: once its dispatcher holds its leases "
        "and follows its stream) to the last. The endpoint also runs its leased "
        "dispatcher (idle) and health. Ratios are medians of per-round ratios (IQR). Client "
        "CPU: this process's CPU time (all threads) per message over the same span; wire "
        "server CPU: the wire server's over the same span (every client's work, from /proc). "
        f"{rounds} rounds. Load average when the run began: {load:.1f}, ended: "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
    ]
    return table
