"""Client CPU per entry of the RabbitMQ publish paths alone (no dispatcher): where a
confirmed publish spends its time.

- ``aio-pika``: the raw loop of ``benchmarks/rabbitmq.py`` (``Exchange.publish`` of an
  ``aio_pika.Message`` per entry, every one in flight at once);
- ``aiormq``: ``basic_publish`` on aiormq's channel per entry, one task each, as
  ``AsyncRabbitPublisher`` did before its rounds were written as frames;
- ``lean``: ``AsyncRabbitPublisher.publish_many`` of every entry in one round (frames
  written once on the publisher's own connection, confirms settled into the round, no
  task or future per entry or per confirm frame);
- ``lean-rounds``: the same in rounds of 6 from 32 concurrent callers, the shape of the
  dispatcher's rounds at 10 entries per aggregate;
- ``lean-singles``: rounds of one entry from 32 concurrent callers: the broker then
  confirms mostly one message per ack frame.

Persistent messages of the benchmark's records to a durable queue on the shared broker,
interleaved rounds; client CPU is ``time.process_time`` over each publish span. Run:
``python -m benchmarks.rabbitmq_cpu [--entries N] [--rounds R] [--profile]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Awaitable, Callable

import aio_pika

from benchmarks.ledger import make_entry
from benchmarks.rabbit import Sandbox, rabbitmq_url
from docoutbox import OutboxMessage
from docoutbox.codec import WireFormat
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher, amqp_properties
from docoutbox_rabbitmq.amqp import message_for

KINDS = ["aio-pika", "aiormq", "lean", "lean-rounds", "lean-singles"]


async def publish_all(
    kind: str, url: str, exchange: str, entries: list[OutboxMessage]
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """A connected publisher of ``kind``: the coroutine function that publishes every
    entry and returns once all are confirmed, and the one that closes its connection."""
    if kind in ("aio-pika", "aiormq"):
        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        target = await channel.get_exchange(exchange, ensure=False)
        underlay = await channel.get_underlay_channel()

        async def by_aio_pika(entry: OutboxMessage) -> None:
            body, fields = message_for(entry, WireFormat.PLAIN)
            await target.publish(aio_pika.Message(body, **fields), entry.type, mandatory=True)

        async def by_aiormq(entry: OutboxMessage) -> None:
            body, fields = message_for(entry, WireFormat.PLAIN)
            await underlay.basic_publish(
                body,
                exchange=exchange,
                routing_key=entry.type,
                properties=amqp_properties(fields),
                mandatory=True,
            )

        one = by_aio_pika if kind == "aio-pika" else by_aiormq

        async def tasks() -> None:
            await asyncio.gather(*(one(entry) for entry in entries))

        return tasks, connection.close
    publisher = AsyncRabbitPublisher(url, exchange)
    await publisher.publish(make_entry("warm-up"))

    async def one_round() -> None:
        outcomes = await publisher.publish_many(entries)
        assert outcomes == [None] * len(entries), outcomes[:3]

    async def rounds_of_6() -> None:
        chunks = [entries[i : i + 6] for i in range(0, len(entries), 6)]

        async def caller(mine: list[list[OutboxMessage]]) -> None:
            for chunk in mine:
                assert await publisher.publish_many(chunk) == [None] * len(chunk)

        await asyncio.gather(*(caller(chunks[c::32]) for c in range(32)))

    async def singles() -> None:
        async def caller(mine: list[OutboxMessage]) -> None:
            for entry in mine:
                assert await publisher.publish_many([entry]) == [None]

        await asyncio.gather(*(caller(entries[c::32]) for c in range(32)))

    shapes = {"lean": one_round, "lean-rounds": rounds_of_6, "lean-singles": singles}
    return shapes[kind], publisher.close


def measure(
    kind: str, url: str, exchange: str, entries: list[OutboxMessage], profile: bool
) -> tuple[float, float, str]:
    """(entries/s, client CPU µs per entry, profile text) of one publish of ``entries``."""

    async def main() -> tuple[float, float, str]:
        work, close = await publish_all(kind, url, exchange, entries)
        profiler = cProfile.Profile() if profile else None
        cpu, began = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        await work()
        if profiler is not None:
            profiler.disable()
        wall, spent = time.perf_counter() - began, time.process_time() - cpu
        await close()
        text = ""
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
            text = out.getvalue()
        return len(entries) / wall, spent / len(entries) * 1e6, text

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    url = rabbitmq_url()
    box = Sandbox(url)
    try:
        exchange, queue, _ = box.names()
        box.channel.exchange_declare(exchange, "topic", durable=True)
        box.channel.queue_declare(queue, durable=True)
        box.channel.queue_bind(queue, exchange, "#")
        entries = [make_entry(f"agg-{i // 10}", i % 10 + 1) for i in range(args.entries)]
        rates: dict[str, list[float]] = {k: [] for k in KINDS}
        cpus: dict[str, list[float]] = {k: [] for k in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                rate, cpu, text = measure(kind, url, exchange, entries, args.profile)
                rates[kind].append(rate)
                cpus[kind].append(cpu)
                box.channel.queue_purge(queue)
                if text:
                    print(f"--- {kind}\n{text}")
        for kind in KINDS:
            print(
                f"{kind:12} {statistics.median(rates[kind]):8,.0f}/s  "
                f"CPU µs/entry median {statistics.median(cpus[kind]):6.1f} "
                f"(min {min(cpus[kind]):.1f}, max {max(cpus[kind]):.1f})"
            )
    finally:
        box.close()


if __name__ == "__main__":
    main()
