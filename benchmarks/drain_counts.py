"""What a drain does, counted: the same backlog dispatched to memory, Kafka and RabbitMQ.

For each dispatcher (threads and asyncio; to memory, to Kafka with ``linger.ms`` 5, to
RabbitMQ through the pipelining publishers) over a fresh backlog of ``--entries`` at
``--density`` entries per aggregate, per drain:

- store operations: copies loaded, single writes and grouped writes, the plans written by
  kind (``TrimPlan`` per aggregate says whether an aggregate's trims were split into
  several writes), pending queries;
- the change stream: reads, empty reads, events per published entry;
- publish rounds and entries per round;
- client CPU per entry (every thread of this process) split by thread (the dispatcher's
  loop, its workers, the broker clients' own threads), and context switches per round,
  over the timed span (start to the last publish).

Counts cover the drain from its start until the dispatcher stopped (deferred trims
included); only this process is counted, the database and the brokers run apart.
Variants run interleaved, ``--rounds`` times. Run:
``DOCOUTBOX_KAFKA_PORT=19092 python -m benchmarks.drain_counts [--density 10] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import inspect
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import dispatch, kafka, rabbitmq
from benchmarks.common import connect, mongo_server
from benchmarks.rabbit import Sandbox
from benchmarks.servers import Topics
from docoutbox.dispatch.drivers.operations import AsyncPorts, Ports
from docoutbox_mongo import backend, changes

Counts = collections.Counter[str]
#: Counts shown even when nothing was counted.
SHOWN = ("loads", "writes", "pending queries", "stream reads", "empty reads", "events")
#: CPU ns and context switches per thread ID, with the thread's name.
Snapshot = dict[int, tuple[str, int, int]]


class Counting:
    """Counters bumped by the patched store, stream and publish-round methods."""

    def __init__(self) -> None:
        self.counts: Counts = collections.Counter()
        self._lock = threading.Lock()

    def bump(self, key: str, by: int = 1) -> None:
        with self._lock:
            self.counts[key] += by

    def write(self, args: tuple[Any, ...], _: object) -> None:
        self.bump("writes")
        self.bump(f"plans.{type(args[0]).__name__}")

    def write_many(self, args: tuple[Any, ...], _: object) -> None:
        self.bump("grouped writes")
        for plan in args[0]:
            self.bump(f"plans.{type(plan).__name__}")

    def poll(self, _: tuple[Any, ...], events: Any) -> None:
        self.bump("stream reads")
        self.bump("events", len(events))
        if not events:
            self.bump("empty reads")

    def publish_round(self, args: tuple[Any, ...], _: object) -> None:
        self.bump("publish rounds")
        self.bump("round entries", len(args[0]))


def _after(cls: type, name: str, note: Callable[[tuple[Any, ...], Any], None]) -> Any:
    """A replacement of ``cls.name`` (sync or async) that notes each call's arguments and
    result; the original method."""
    original = getattr(cls, name)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def noted_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(self, *args, **kwargs)
            note(args, result)
            return result

        setattr(cls, name, noted_async)
    else:

        @functools.wraps(original)
        def noted(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            note(args, result)
            return result

        setattr(cls, name, noted)
    return original


@contextlib.contextmanager
def counted(counting: Counting) -> Iterator[None]:
    """Count through the MongoDB adapter's backends and change sources and the drivers'
    publish rounds; the methods are restored on exit."""
    notes: list[tuple[type, str, Callable[[tuple[Any, ...], Any], None]]] = [
        (backend.MongoBackend, "write", counting.write),
        (backend.MongoBackend, "write_many", counting.write_many),
        (backend.MongoBackend, "load", lambda _a, _r: counting.bump("loads")),
        (backend.MongoBackend, "find_pending", lambda _a, _r: counting.bump("pending queries")),
        (changes.MongoChangeSource, "poll", counting.poll),
        (Ports, "publish_round", counting.publish_round),
    ]
    notes += [
        (backend.AsyncMongoBackend, "write", counting.write),
        (backend.AsyncMongoBackend, "write_many", counting.write_many),
        (backend.AsyncMongoBackend, "load", lambda _a, _r: counting.bump("loads")),
        (
            backend.AsyncMongoBackend,
            "find_pending",
            lambda _a, _r: counting.bump("pending queries"),
        ),
        (changes.AsyncMongoChangeSource, "poll", counting.poll),
        (AsyncPorts, "publish_round", counting.publish_round),
    ]
    originals = [(cls, name, _after(cls, name, note)) for cls, name, note in notes]
    try:
        yield
    finally:
        for cls, name, original in reversed(originals):
            setattr(cls, name, original)


def threads() -> Snapshot:
    """CPU ns and context switches of every thread of this process, by thread ID."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    found: Snapshot = {}
    for tid in os.listdir("/proc/self/task"):
        task = f"/proc/self/task/{tid}"
        try:
            with open(f"{task}/schedstat") as stat, open(f"{task}/comm") as comm:
                ns, name = int(stat.read().split()[0]), comm.read().strip()
            with open(f"{task}/status") as status:
                switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        except OSError:  # the thread ended meanwhile
            continue
        found[int(tid)] = (names.get(int(tid), name), ns, switches)
    return found


def by_group(before: Snapshot, after: Snapshot, entries: int) -> dict[str, float]:
    """CPU µs per entry spent between two snapshots, per group of like-named threads."""
    spent: collections.Counter[str] = collections.Counter()
    for tid, (name, ns, _) in after.items():
        group = re.sub(r"[-_ ]?\d+", "#", name)
        spent[group] += ns - before.get(tid, (name, 0, 0))[1]
    return {group: round(ns / entries / 1000, 1) for group, ns in spent.most_common() if ns > 0}


def switches(before: Snapshot, after: Snapshot) -> int:
    return sum(s - before.get(tid, ("", 0, 0))[2] for tid, (_, _, s) in after.items())


class Drain:
    """``benchmarks.dispatch.timed_drain`` with the counts of one drain noted."""

    def __init__(self, counting: Counting) -> None:
        self.counting = counting
        self.row: dict[str, Any] = {}

    def __call__(self, reader: Any, entries: int, cpu: list[float] | None = None) -> float:
        self.counting.counts.clear()  # the backlog's own commits are not the drain's
        cpu_began, before = time.process_time(), threads()
        began = time.perf_counter()
        reader.start()
        dispatch._wait(lambda: len(reader.seen) >= entries)
        after = threads()
        spent = (time.process_time() - cpu_began) / entries * 1e6
        rate = entries / (max(reader.seen.values()) - began)
        reader.finish()
        counts = {key: 0 for key in SHOWN} | dict(self.counting.counts)
        self.row = {
            "entries/s": round(rate),
            "CPU µs/entry": round(spent, 1),
            "switches": switches(before, after),
            "threads µs/entry": by_group(before, after, entries),
            **counts,
        }
        return float(rate)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--density", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    entries, density = args.entries, args.density
    bootstrap, url = kafka.broker(), rabbitmq.broker()
    counting = Counting()
    drain = Drain(counting)
    for module in (dispatch, kafka, rabbitmq):
        module.timed_drain = drain  # type: ignore[attr-defined]
    with mongo_server() as uri, counted(counting):
        client = connect(uri)
        topics, box = Topics(bootstrap), Sandbox(url)
        try:
            topic = topics.create(f"counts-{uuid.uuid4().hex[:6]}", partitions=4)
            exchange, queue, _ = box.names()
            box.channel.exchange_declare(exchange, "topic", durable=True)
            box.channel.queue_declare(queue, durable=True)
            box.channel.queue_bind(queue, exchange, "#")
            on_kafka = functools.partial(kafka.dispatcher, client, bootstrap, topic, entries)
            on_rabbit = functools.partial(rabbitmq.dispatcher, client, url, exchange, entries)
            variants: dict[str, Callable[[], float]] = {
                "threads -> memory": lambda: on_kafka(density, "threads-memory"),
                "asyncio -> memory": lambda: on_kafka(density, "async-memory"),
                "threads -> Kafka": lambda: on_kafka(density, "threads"),
                "asyncio -> Kafka": lambda: on_kafka(density, "async"),
                "threads -> RabbitMQ": lambda: on_rabbit(density, "threads-pipelined"),
                "asyncio -> RabbitMQ": lambda: on_rabbit(density, "async"),
            }
            on_kafka(density, "async")  # a warm-up of the broker, the server, the drivers
            for round_ in range(args.rounds):
                for name, variant in variants.items():
                    variant()
                    box.channel.queue_purge(queue)
                    print(round_, name, json.dumps(drain.row, ensure_ascii=False), flush=True)
        finally:
            box.close()
            topics.close()
            client.drop_database("docoutbox_bench")
            client.close()


if __name__ == "__main__":
    main()
