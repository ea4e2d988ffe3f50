"""Benchmark 5: dispatcher throughput and commit-to-publish latency, against a raw
change-stream loop that only reads the same events, on the same server in the same run.

- drain: N commits are made first; the reader then starts from a position before them
  and runs until it has read every event (raw) or published every entry (dispatcher);
- live: the reader runs first; a producer commits at a fixed pace; latency is the time
  from a commit returning to the entry being read (raw) or published (dispatcher).

The drain also runs a *floor*: the least work any dispatcher does, written by hand. It
reads the same stream, "publishes" each entry once into a dict and trims what it
published with one unordered ``bulk_write`` of ``$pull``s per batch of events. It keeps
no order across aggregates, no checkpoint and no failure handling, so it is not a
competitor: floor vs raw shows what trimming alone costs on this server, and dispatcher vs
floor what docoutbox's own work costs.

The dispatcher uses :class:`~docoutbox.testing.MemoryPublisher` (timestamped here), its
change stream source and its default configuration. Both readers poll with ``try_next()``
and sleep the dispatcher's ``poll_interval`` when there is nothing new.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from bson import Timestamp
from pymongo import AsyncMongoClient, UpdateOne

from benchmarks.common import (
    CommandCounter,
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    percentile,
    ratio_range,
)
from benchmarks.workload import Account, Feed, account_ids, handlers, make_store
from docoutbox import OutboxMessage
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.store.document import new_document, partition_of
from docoutbox.testing import AsyncMemoryPublisher, MemoryPublisher
from docoutbox.testing.dispatch import MemoryCheckpoints
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.changes import PIPELINE, AsyncMongoChangeSource, MongoChangeSource

POLL = DispatcherConfig().poll_interval
TIMEOUT = 300.0
DENSITIES = (1, 10)  # pending entries per aggregate in the drain backlog
LIVE_DENSITY = 10
DISPATCH_ROUNDS = 7
#: The readers compared: the raw loop (baseline) and the two dispatcher drivers.
KINDS = ["raw", "dispatcher", "async"]
#: Events the floor reads before trimming what it published: the dispatcher's batch.
FLOOR_BATCH = DispatcherConfig().batch_size


class TimedPublisher(MemoryPublisher):
    """The in-memory publisher, noting when each entry was accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    def publish(self, entry: OutboxMessage) -> None:
        super().publish(entry)
        self.at.setdefault(entry.id, time.perf_counter())


def aggregates(entries: int, per_aggregate: int) -> int:
    return max(1, entries // per_aggregate)


class Workbench:
    """A fresh collection of accounts, a producer, and a stream start point."""

    def __init__(self, client: Any, entries: int, per_aggregate: int) -> None:
        self.coll = new_collection(client, "dispatch")
        self.accounts = account_ids(aggregates(entries, per_aggregate))
        now = datetime.now(UTC)
        self.coll.insert_many(
            [
                new_document(
                    a, Account.aggregate_type, Account().model_dump(), partition_of(a, 16), now
                )
                for a in self.accounts
            ]
        )
        self.store = make_store(self.coll)
        self.feed = Feed(self.accounts, emit=True)
        self.committed: dict[str, float] = {}
        # Start on a fresh second so the setup inserts are behind the start point.
        second = int(time.time()) + 1
        time.sleep(max(0.0, second - time.time()))
        self.start = Timestamp(second, 0)

    def resumed(self, name: str = "bench") -> tuple[DispatcherConfig, MemoryCheckpoints]:
        """A dispatcher configuration named ``name``, and checkpoints that resume it at the
        start point."""
        config = DispatcherConfig(name=name)
        checkpoints = MemoryCheckpoints()
        checkpoints.save(name, {"start_at": self.start})
        return config, checkpoints

    def produce(self, count: int, pace: float = 0.0) -> None:
        """Commit ``count`` messages, one emitted entry each; ``pace`` msgs/s (0: flat out)."""
        began = time.perf_counter()
        for index, (account, message) in enumerate(self.feed.take(count)):
            if pace:
                delay = began + index / pace - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            outcome = self.store.handle(account, message, handlers)
            self.committed[outcome.emitted[0].id] = time.perf_counter()


class RawReader:
    """A raw ``watch()`` + ``try_next()`` loop over the dispatcher's own pipeline."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        self.events = 0
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self, until_events: int | None = None) -> None:
        with self.bench.coll.watch(
            PIPELINE, full_document="updateLookup", start_at_operation_time=self.bench.start
        ) as stream:
            while not self.stop.is_set():
                change = stream.try_next()
                if change is None:
                    time.sleep(POLL)
                    continue
                now = time.perf_counter()
                self.events += 1
                for entry in change["fullDocument"].get("outbox", ()):
                    self.seen.setdefault(entry["id"], now)
                if until_events is not None and self.events >= until_events:
                    return


class FloorReader:
    """The least work of any dispatcher: read, publish each entry once, trim in bulk."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        self.seen: dict[str, float] = {}

    def run(self) -> None:
        wanted = len(self.bench.committed)
        with self.bench.coll.watch(
            PIPELINE, full_document="updateLookup", start_at_operation_time=self.bench.start
        ) as stream:
            while len(self.seen) < wanted:
                pulls: dict[Any, list[str]] = {}
                for _ in range(FLOOR_BATCH):
                    change = stream.try_next()
                    if change is None:
                        time.sleep(POLL)
                        break
                    doc = change["fullDocument"]
                    for entry in doc.get("outbox", ()):
                        if entry["id"] not in self.seen:
                            self.seen[entry["id"]] = time.perf_counter()
                            pulls.setdefault(doc["_id"], []).append(entry["id"])
                    if len(self.seen) >= wanted:
                        break
                if pulls:
                    self.bench.coll.bulk_write(
                        [
                            UpdateOne(
                                {"_id": aggregate}, {"$pull": {"outbox": {"id": {"$in": ids}}}}
                            )
                            for aggregate, ids in pulls.items()
                        ],
                        ordered=False,
                    )
        pending = self.bench.coll.count_documents({"outbox.0": {"$exists": True}})
        if pending or set(self.seen) != set(self.bench.committed):
            raise AssertionError(
                f"the floor left {pending} documents pending, published {len(self.seen)} "
                f"of {wanted} committed entries"
            )


class DispatchReader:
    """The real dispatcher, resuming from the workbench's start point: the threaded
    :class:`Dispatcher`, or (``kind="async"``) the :class:`AsyncDispatcher` on pymongo's
    ``AsyncMongoClient`` in an event loop of its own."""

    def __init__(
        self,
        bench: Workbench,
        kind: str = "dispatcher",
        client: Any = None,
        listeners: tuple[Any, ...] = (),
    ) -> None:
        self.bench = bench
        self.publisher = self._timed()
        config, checkpoints = bench.resumed()
        self.dispatcher: Dispatcher | AsyncDispatcher
        if kind == "async":
            self._run_async(config, checkpoints, listeners)
            return
        coll = bench.coll if client is None else client[bench.coll.database.name][bench.coll.name]
        self.dispatcher = Dispatcher(
            MongoBackend(coll),
            self._sync_publisher(),
            MemoryDeadLetters(),
            source=MongoChangeSource(coll),
            checkpoints=checkpoints,
            config=config,
        )
        self.thread = threading.Thread(target=self.dispatcher.run, daemon=True)

    def _run_async(
        self, config: DispatcherConfig, checkpoints: MemoryCheckpoints, listeners: tuple[Any, ...]
    ) -> None:
        made = threading.Event()
        uri = "mongodb://{}:{}".format(*self.bench.coll.database.client.address)

        async def main() -> None:
            client: Any = AsyncMongoClient(
                uri, uuidRepresentation="standard", event_listeners=list(listeners)
            )
            # Connected before the timed drain, as the raw loop's client is: an async
            # client opens its topology and first connection on its first command.
            await client.admin.command("ping")
            coll = client[self.bench.coll.database.name][self.bench.coll.name]
            publisher = self._async_publisher()
            self.dispatcher = AsyncDispatcher(
                AsyncMongoBackend(coll),
                publisher,
                in_thread(MemoryDeadLetters()),
                source=AsyncMongoChangeSource(coll),
                checkpoints=in_thread(checkpoints),
                config=config,
            )
            made.set()
            await asyncio.to_thread(self._go.wait)
            try:
                await self.dispatcher.run()
            finally:
                await client.close()
                await self._close_async(publisher)

        self._go = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self.thread.start()
        made.wait(TIMEOUT)

    # What the dispatcher publishes to: the timestamped memory publisher, unless a
    # subclass publishes to a broker (it records confirms in ``self.publisher`` too).

    def _timed(self) -> TimedPublisher:
        return TimedPublisher()

    def _sync_publisher(self) -> Any:
        return self.publisher

    def _async_publisher(self) -> Any:
        return AsyncMemoryPublisher(self.publisher)

    async def _close_async(self, publisher: Any) -> None:
        return None

    @property
    def seen(self) -> dict[str, float]:
        return self.publisher.at

    def start(self) -> None:
        if self.thread.is_alive():
            self._go.set()
        else:
            self.thread.start()
        self.dispatcher.started.wait(TIMEOUT)

    def finish(self) -> None:
        self.dispatcher.stop()
        self.thread.join(TIMEOUT)
        pending = self.bench.coll.count_documents({"outbox.0": {"$exists": True}})
        ids = self.publisher.ids()
        if pending or len(ids) != len(set(ids)) or set(ids) != set(self.bench.committed):
            raise AssertionError(
                f"dispatcher left {pending} documents pending, published {len(ids)} entries "
                f"({len(set(ids))} distinct) of {len(self.bench.committed)} committed"
            )


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the reader did not finish in time")
        time.sleep(0.002)


def backlog(client: Any, entries: int, per_aggregate: int) -> Workbench:
    """A workbench with ``entries`` committed, then a full garbage collection.

    Without it, a full collection of what the commits (and the round before) left behind
    fell inside the timed drain of some readers and not of others: 14-68 ms, in drains of
    200-400 ms. Every reader now starts from a collected heap.
    """
    bench = Workbench(client, entries, per_aggregate)
    bench.produce(entries)
    gc.collect()
    return bench


def drain_raw(client: Any, entries: int, per_aggregate: int) -> float:
    bench = backlog(client, entries, per_aggregate)
    reader = RawReader(bench)
    began = time.perf_counter()
    reader.run(until_events=entries)
    return entries / (time.perf_counter() - began)


def drain_floor(client: Any, entries: int, per_aggregate: int) -> float:
    bench = backlog(client, entries, per_aggregate)
    reader = FloorReader(bench)
    began = time.perf_counter()
    reader.run()
    return entries / (max(reader.seen.values()) - began)


def drain_dispatcher(client: Any, entries: int, per_aggregate: int, kind: str) -> float:
    bench = backlog(client, entries, per_aggregate)
    reader = DispatchReader(bench, kind)
    gc.collect()
    return timed_drain(reader, entries)


def timed_drain(reader: Any, entries: int, cpu: list[float] | None = None) -> float:
    """Start ``reader`` (a :class:`DispatchReader` or a broker's twin of it), wait until it
    saw ``entries`` publishes, stop it: entries per second to the last publish. A given
    ``cpu`` receives the client CPU per entry in µs (this process's, every thread's, over
    the same span: the database and the broker run in processes of their own)."""
    cpu_began = time.process_time()
    began = time.perf_counter()
    reader.start()
    _wait(lambda: len(reader.seen) >= entries)
    if cpu is not None:
        cpu.append((time.process_time() - cpu_began) / entries * 1e6)
    rate = entries / (max(reader.seen.values()) - began)
    reader.finish()
    return float(rate)


def live(
    client: Any,
    entries: int,
    pace: float,
    kind: str,
    reader_for: Callable[[Workbench, str], Any] = DispatchReader,
) -> list[float]:
    """Commit-to-read (raw) or commit-to-publish (dispatcher) latencies, in seconds; a
    dispatcher is ``reader_for(bench, kind)`` (a :class:`DispatchReader` or a twin)."""
    bench = Workbench(client, entries, LIVE_DENSITY)
    if kind == "raw":
        raw = RawReader(bench)
        thread = threading.Thread(target=raw.run, daemon=True)
        thread.start()
        seen = raw.seen
    else:
        reader = reader_for(bench, kind)
        reader.start()
        seen = reader.seen
    time.sleep(0.2)
    bench.produce(entries, pace)
    _wait(lambda: len(seen) >= entries)
    if kind == "raw":
        raw.stop.set()
        thread.join(TIMEOUT)
    else:
        reader.finish()
    return [seen[entry_id] - at for entry_id, at in bench.committed.items()]


def run(uri: str, scale: Scale) -> Table:
    client = connect(uri)
    entries = scale.dispatch_entries
    live_entries, pace = max(10, entries // 4), 200.0
    rounds = min(scale.rounds, DISPATCH_ROUNDS)
    latencies: dict[str, list[list[float]]] = {kind: [] for kind in KINDS}
    try:
        # Live rounds first: every getMore of the wire server scans its whole oplog, so
        # latency is measured while the oplog is still small.
        for index in range(scale.warmup + rounds):
            shift = index % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                measured = live(client, live_entries, pace, kind)
                if index >= scale.warmup:
                    latencies[kind].append(measured)
        plan: dict[str, Callable[[], float]] = {}
        for density in DENSITIES:
            plan[f"raw {density}"] = partial(drain_raw, client, entries, density)
            plan[f"floor {density}"] = partial(drain_floor, client, entries, density)
            for kind in KINDS[1:]:
                plan[f"{kind} {density}"] = partial(
                    drain_dispatcher, client, entries, density, kind
                )
        drain = interleaved(plan, rounds, scale.warmup)
        trips = {
            kind: {
                density: round_trips(client, uri, entries, density, kind) for density in DENSITIES
            }
            for kind in KINDS[1:]
        }
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    return _table(drain, latencies, entries, live_entries, pace, trips)


def _vs(candidate: list[float], baseline: list[float]) -> tuple[float, str]:
    """The paired ratio, and its table cell with the interquartile range."""
    low, high = ratio_range(candidate, baseline)
    ratio = paired_ratio(candidate, baseline)
    return ratio, f"{ratio:.2f}x ({low:.2f}-{high:.2f})"


def round_trips(client: Any, uri: str, entries: int, per_aggregate: int, kind: str) -> float:
    """Commands a dispatcher sends per published entry, draining a backlog (untimed, on a
    client that counts its commands)."""
    counter = CommandCounter()
    counting = connect(uri, counter)
    try:
        bench = backlog(client, entries, per_aggregate)
        reader = DispatchReader(bench, kind, client=counting, listeners=(counter,))
        with counter.counting() as tally:
            reader.start()
            _wait(lambda: len(reader.seen) >= entries)
            reader.finish()
        return tally.round_trips / entries
    finally:
        counting.close()


def _table(
    drain: dict[str, list[float]],
    latencies: dict[str, list[list[float]]],
    entries: int,
    live_entries: int,
    pace: float,
    trips: dict[str, dict[int, float]],
) -> Table:
    columns = ["reader"]
    for density in DENSITIES:
        columns += [f"drain {density}/agg entries/s", f"drain {density}/agg vs raw", "vs floor"]
    columns += ["live p50 ms", "live p99 ms", "p50 vs raw", "p99 vs raw"]
    table = Table(
        "dispatch",
        "Dispatcher (change stream, MemoryPublisher) vs a raw change-stream read loop",
        columns,
    )
    stats: dict[str, tuple[float, float]] = {}
    for kind, runs in latencies.items():
        p50 = median([percentile(run, 50) for run in runs]) * 1000
        p99 = median([percentile(run, 99) for run in runs]) * 1000
        stats[kind] = (p50, p99)
    for kind, label in (
        ("raw", "raw watch() + try_next()"),
        ("floor", "floor: read, publish, bulk trim by hand"),
        ("dispatcher", "docoutbox Dispatcher (threads)"),
        ("async", "docoutbox AsyncDispatcher (asyncio)"),
    ):
        row: list[Any] = [label]
        figures: dict[str, float] = {}
        for density in DENSITIES:
            name = f"{kind} {density}"
            ratio, cell = _vs(drain[name], drain[f"raw {density}"])
            floor_ratio, floor_cell = _vs(drain[name], drain[f"floor {density}"])
            row += [median(drain[name]), cell, floor_cell]
            figures[f"drain_{density}_per_s"] = median(drain[name])
            figures[f"drain_{density}_ratio"] = ratio
            figures[f"drain_{density}_vs_floor"] = floor_ratio
        if kind in stats:
            p50, p99 = stats[kind]
            row += [p50, p99, f"{p50 / stats['raw'][0]:.2f}x", f"{p99 / stats['raw'][1]:.2f}x"]
            figures |= {"p50_ms": p50, "p99_ms": p99}
        else:
            row += ["-"] * 4
        table.add(*row)
        table.figures[kind] = figures
    table.figures["round_trips_per_entry"] = {
        kind: {f"drain_{d}": t for d, t in by_density.items()} for kind, by_density in trips.items()
    }
    table.notes += [
        f"drain: {entries:,} commits (1 entry each) on {entries // DENSITIES[0]:,} or "
        f"{entries // DENSITIES[1]:,} aggregates, made before the reader starts. The raw "
        "loop reads as many events; the dispatcher publishes and trims every entry "
        "(checked: each exactly once, nothing left pending). One dispatch run publishes all "
        "of an aggregate's pending entries, and the change events of aggregates already "
        "trimmed are filtered out by the server, hence the effect of density.",
        "round trips per published entry (every command a dispatcher sends while draining, "
        "change-stream getMores included): "
        + "; ".join(
            f"{kind} " + ", ".join(f"{t:.3f} at {d}/agg" for d, t in by_density.items())
            for kind, by_density in trips.items()
        )
        + ". Each run publishes from the change event's copy of the document (no reload); "
        "the trims of concurrent runs go out together, one bulk_write of $pulls per round.",
        "floor: the same stream read by hand, each entry published once into a dict, and "
        f"what was published trimmed with one unordered bulk_write of $pulls per {FLOOR_BATCH} "
        "events: no order across aggregates, no checkpoint, no failure handling. Floor vs "
        "raw shows what trimming alone costs on this server; dispatcher vs floor, what "
        "docoutbox's own work costs.",
        f"live: {live_entries:,} commits ({aggregates(live_entries, LIVE_DENSITY):,} "
        f"aggregates) at {pace:.0f}/s while the reader runs (measured first, on a small "
        f"oplog); both poll with try_next() and sleep {POLL * 1000:.0f} ms when idle (the "
        "dispatcher's default). Latencies are medians over rounds of each round's percentile.",
    ]
    return table
