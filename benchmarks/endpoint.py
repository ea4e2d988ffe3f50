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
  health. Its change stream brings nothing, so its reads space out up to one a second
  (:data:`~docoutbox_app.endpoint.runtime.STREAM_WAIT`);
- endpoint, reading every 0.05 s: the same, its stream read every 0.05 s as before
  ``max_stream_wait`` (``DispatchOptions(max_stream_wait=0.05)``). On the wire server
  every read scans the whole oplog, which grows with every round;
- endpoint, sweeping: the same, its dispatcher sweeping every second instead of following
  the change stream (``DispatchOptions(poll_interval=1.0)``).

Each is timed from its first delivery applied to its last (connections, lease taking and
start-up left out): the steady rate of handling, and the CPU time this process spent
meanwhile per message (every thread's: the endpoint's lease keeper and drivers too; not
the servers'), which a loaded machine disturbs much less than the rate.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from functools import partial
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


class Span:
    """From the first delivery applied to the last: the rate, and this process's CPU
    milliseconds per message."""

    def __init__(self) -> None:
        self.started: tuple[float, float] | None = None

    def begin(self) -> None:
        if self.started is None:
            self.started = (time.perf_counter(), time.process_time())

    def end(self, count: int) -> tuple[float, float]:
        assert self.started is not None
        wall, cpu = self.started
        handled = count - 1
        return handled / (time.perf_counter() - wall), (time.process_time() - cpu) * 1e3 / handled


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


async def plain(uri: str, url: str, queue: str, count: int) -> tuple[float, float]:

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
                    span.begin()
                if handled == count:
                    break
        return span.end(count)
    finally:
        await connection.close()
        await kit.close()


async def consumer(uri: str, url: str, queue: str, count: int) -> tuple[float, float]:

    collection = f"endpoint_consumer_{uuid.uuid4().hex[:8]}"
    kit = await open_async_kit(uri, DATABASE, collection)
    store = AsyncAggregateStore(kit.backend, Ledger, EXACT)
    span = Span()

    def first(verdict: Any, redelivered: bool) -> None:
        span.begin()

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


async def endpoint(
    uri: str,
    url: str,
    queue: str,
    count: int,
    poll_interval: float | None = None,
    max_stream_wait: float | None = None,
) -> tuple[float, float]:

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
    running = asyncio.create_task(run_endpoint(made, made.settings(), stop, observation))
    label = made.inputs[0].label
    while True:
        health = observation.health.endpoints.get("bench")
        stats = health.stats.get(label) if health is not None else None
        if stats is not None and stats.applied >= 1:
            span.begin()
        if stats is not None and stats.applied >= count:
            break
        if running.done():
            running.result()  # raises what stopped it
        await asyncio.sleep(0.01)
    measured = span.end(count)
    stop.set()
    await running
    assert (stats.applied, stats.rejected) == (count, 0), stats
    return measured


def one(variant: Callable[..., Any], uri: str, url: str, count: int, cpu: list[float]) -> float:
    """One round of ``variant`` on a freshly filled queue: its rate (its CPU per message
    goes to ``cpu``)."""
    queue = fill(url, count)
    try:
        rate, per_message = asyncio.run(variant(uri, url, queue, count))
        cpu.append(per_message)
        return float(rate)
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
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    plan = {name: partial(one, v, uri, url, count, cpu[name]) for name, v in variants.items()}
    rounds = min(scale.rounds, ROUNDS)
    samples = interleaved(plan, rounds, scale.warmup)
    table = Table(
        "endpoint",
        "Endpoint consuming from RabbitMQ vs a plain consumer loop (same store.handle)",
        ["variant", "messages/s", "vs plain loop", "client CPU ms/msg", "CPU vs plain loop"],
    )
    used = {name: taken[-rounds:] for name, taken in cpu.items()}  # after the warm-up
    for name in plan:
        low, high = ratio_range(samples[name], samples["plain"])
        ratio = paired_ratio(samples[name], samples["plain"])
        cpu_ratio = paired_ratio(used[name], used["plain"])
        table.add(
            name,
            median(samples[name]),
            f"{ratio:.2f}x ({low:.2f}-{high:.2f})",
            f"{median(used[name]):.3f}",
            f"{cpu_ratio:.2f}x",
        )
        table.figures[name] = {
            "per_s": median(samples[name]),
            "ratio": ratio,
            "cpu_ms_per_message": median(used[name]),
            "cpu_ratio": cpu_ratio,
        }
    table.notes += [
        f"{count:,} deliveries per round from a pre-filled queue of the local RabbitMQ, "
        f"{PRODUCERS} producing aggregates, prefetch {PREFETCH}, into a fresh collection of "
        "the wire server (AsyncMongoClient, exact de-duplication); timed from the first "
        "delivery applied to the last (start-up left out). The endpoint also runs its leased "
        "dispatcher (idle) and health. Ratios are medians of per-round ratios (IQR). Client "
        "CPU: this process's CPU time (all threads) per message over the same span, not the "
        f"servers'. {rounds} rounds. Load average when the run ended: "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
    ]
    return table
