"""What a drain does, counted: the same backlog dispatched to memory, Kafka and RabbitMQ,
and read by the raw change-stream loop of ``benchmarks.dispatch``.

For each dispatcher (threads and asyncio; to memory, to Kafka with ``linger.ms`` 5, to
RabbitMQ through the pipelining publishers) and for the raw read, over a fresh backlog of
``--entries`` at ``--density`` entries per aggregate, per drain:

- store operations: copies loaded, single writes and grouped writes, the plans written by
  kind (``TrimPlan`` per aggregate says whether an aggregate's trims were split into
  several writes), pending queries;
- the change stream: reads, empty reads, events per published entry;
- publish rounds and entries per round;
- client CPU per entry (every thread of this process) split by thread (the dispatcher's
  loop, its workers, the broker clients' own threads), and context switches per round,
  over the timed span (start to the last publish);
- garbage collections per generation and their time, over the same span;
- the time after the stream's answer: from the change stream's opening (whose reply
  carries the first batch) to the last publish; for the raw read, from its first event
  to its last. The answer itself is the server's, the same for every reader.

Counts cover the drain from its start until the dispatcher stopped (deferred trims
included); only this process is counted, the database and the brokers run apart.
Variants run interleaved, ``--rounds`` times. Run:
``DOCOUTBOX_KAFKA_PORT=19092 python -m benchmarks.drain_counts [--density 10] [--rounds 2]``;
``--variants raw memory`` runs the raw read and the two dispatchers to memory only (no
broker needed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
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
        #: When the change stream last opened (``perf_counter``): its reply is the answer.
        self.opened = 0.0
        self._lock = threading.Lock()
        self._collecting = 0.0

    def open(self, _: tuple[Any, ...], __: object) -> None:
        self.opened = time.perf_counter()

    def collection(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` hook: counts collections per generation, and their time."""
        if phase == "start":
            self._collecting = time.perf_counter()
            return
        self.bump(f"gc{info['generation']}")
        self.bump("gc µs", round((time.perf_counter() - self._collecting) * 1e6))

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
        (changes.MongoChangeSource, "open", counting.open),
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
        (changes.AsyncMongoChangeSource, "open", counting.open),
        (AsyncPorts, "publish_round", counting.publish_round),
    ]
    originals = [(cls, name, _after(cls, name, note)) for cls, name, note in notes]
    gc.callbacks.append(counting.collection)
    try:
        yield
    finally:
        gc.callbacks.remove(counting.collection)
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
    """``benchmarks.dispatch.timed_drain`` with the counts of one drain noted; also the
    raw read of a backlog, measured alike (:meth:`raw`)."""

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
        last = max(reader.seen.values())
        rate = entries / (last - began)
        collected = {k: v for k, v in self.counting.counts.items() if k.startswith("gc")}
        reader.finish()  # its trims count, its collections do not (the span is timed)
        counts = dict(self.counting.counts) | collected
        self._note(rate, spent, before, after, entries, last - self.counting.opened, counts)
        return float(rate)

    def raw(self, client: Any, entries: int, density: int) -> float:
        """The raw change-stream read of a fresh backlog (``benchmarks.dispatch.RawReader``),
        measured as a drain; its "answer" is its first event."""
        reader = dispatch.RawReader(dispatch.backlog(client, entries, density))
        self.counting.counts.clear()
        cpu_began, before = time.process_time(), threads()
        began = time.perf_counter()
        reader.run(until_events=entries)
        ended = time.perf_counter()
        after = threads()
        spent = (time.process_time() - cpu_began) / entries * 1e6
        counts = dict(self.counting.counts)
        rate = entries / (ended - began)
        self._note(rate, spent, before, after, entries, ended - min(reader.seen.values()), counts)
        return rate

    def _note(
        self,
        rate: float,
        spent: float,
        before: Snapshot,
        after: Snapshot,
        entries: int,
        after_answer: float,
        counts: dict[str, int],
    ) -> None:
        self.row = {
            "entries/s": round(rate),
            "after answer ms": round(after_answer * 1000, 1),
            "CPU µs/entry": round(spent, 1),
            "switches": switches(before, after),
            "threads µs/entry": by_group(before, after, entries),
            **{key: 0 for key in SHOWN},
            **counts,
        }


#: Variant groups: the raw read, the dispatchers to memory, to Kafka, to RabbitMQ.
GROUPS = ("raw", "memory", "kafka", "rabbitmq")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--density", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=GROUPS, default=list(GROUPS))
    args = parser.parse_args()
    entries, density, groups = args.entries, args.density, set(args.variants)
    brokers = bool(groups & {"kafka", "rabbitmq"})
    counting = Counting()
    drain = Drain(counting)
    for module in (dispatch, kafka, rabbitmq):
        module.timed_drain = drain  # type: ignore[attr-defined]
    with mongo_server() as uri, counted(counting):
        client = connect(uri)
        stack = contextlib.ExitStack()
        try:
            variants: dict[str, Callable[[], float]] = {}
            if "raw" in groups:
                variants["raw read"] = lambda: drain.raw(client, entries, density)
            if "memory" in groups:
                for name, kind in (("threads", "dispatcher"), ("asyncio", "async")):
                    variants[f"{name} -> memory"] = functools.partial(
                        dispatch.drain_dispatcher, client, entries, density, kind
                    )
            if brokers:
                variants |= _broker_variants(client, entries, density, groups, stack)
            for variant in variants.values():
                variant()  # a warm-up of the server, the drivers and the brokers
            for round_ in range(args.rounds):
                for name, variant in variants.items():
                    variant()
                    print(round_, name, json.dumps(drain.row, ensure_ascii=False), flush=True)
        finally:
            stack.close()
            client.drop_database("docoutbox_bench")
            client.close()


def _broker_variants(
    client: Any, entries: int, density: int, groups: set[str], stack: contextlib.ExitStack
) -> dict[str, Callable[[], float]]:
    """The dispatchers to Kafka and RabbitMQ named in ``groups``, over a topic and a queue
    of their own (removed when ``stack`` closes)."""
    variants: dict[str, Callable[[], float]] = {}
    if "kafka" in groups:
        bootstrap = kafka.broker()
        topics = Topics(bootstrap)
        stack.callback(topics.close)
        topic = topics.create(f"counts-{uuid.uuid4().hex[:6]}", partitions=4)
        on_kafka = functools.partial(kafka.dispatcher, client, bootstrap, topic, entries)
        variants["threads -> Kafka"] = lambda: on_kafka(density, "threads")
        variants["asyncio -> Kafka"] = lambda: on_kafka(density, "async")
    if "rabbitmq" in groups:
        url = rabbitmq.broker()
        box = Sandbox(url)
        stack.callback(box.close)
        exchange, queue, _ = box.names()
        box.channel.exchange_declare(exchange, "topic", durable=True)
        box.channel.queue_declare(queue, durable=True)
        box.channel.queue_bind(queue, exchange, "#")
        on_rabbit = functools.partial(rabbitmq.dispatcher, client, url, exchange, entries)

        def purged(kind: str) -> float:
            rate = on_rabbit(density, kind)
            box.channel.queue_purge(queue)
            return rate

        variants["threads -> RabbitMQ"] = lambda: purged("threads-pipelined")
        variants["asyncio -> RabbitMQ"] = lambda: purged("async")
    return variants


if __name__ == "__main__":
    main()
