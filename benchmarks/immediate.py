"""Benchmark: commit-to-publish latency with immediate dispatch against stream-only
dispatch, and the duplicates the two paths cause by racing (same run, same server).

Variants, each with a producer committing at a fixed pace while the readers run:

- stream only: the regular :class:`Dispatcher` (change stream, default configuration);
- immediate, one process: :class:`ImmediateDispatcher` on the producing store, with the
  regular dispatcher beside it as safety net, its publisher wrapped by ``guard`` (shared
  claims);
- immediate, two processes: the same, but the dispatcher does not share the claims, as
  when it runs in another process: both paths race for every entry.

The asyncio variants do the same on one event loop: an :class:`AsyncAggregateStore` on
pymongo's ``AsyncMongoClient``, the :class:`AsyncDispatcher` alone or beside an
:class:`AsyncImmediateDispatcher`; their latencies are compared with the asyncio stream
only.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from pymongo import AsyncMongoClient

from benchmarks.common import Scale, Table, connect, median, percentile
from benchmarks.dispatch import LIVE_DENSITY, POLL, TIMEOUT, TimedPublisher, Workbench
from benchmarks.workload import Account, handlers
from docoutbox import AsyncAggregateStore
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.extras.immediate import AsyncImmediateDispatcher, ImmediateDispatcher
from docoutbox.dispatch.extras.settled import SettledPublisher
from docoutbox.testing.publisher import AsyncMemoryPublisher, MemoryDeadLetters
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource

SETTLE = 0.5
KINDS = (
    "stream only",
    "immediate, one process",
    "immediate, two processes",
    "immediate, two processes, settled",
    "asyncio: stream only",
    "asyncio: immediate, one process",
)


def _wait(condition: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the readers did not finish in time")
        time.sleep(0.002)


def live(client: Any, entries: int, pace: float, kind: str) -> tuple[list[float], float]:
    """Latencies (s) from commit to first publish, and duplicate publishes per entry."""
    bench = Workbench(client, entries, LIVE_DENSITY)
    publisher = TimedPublisher()
    if kind.startswith("asyncio"):
        asyncio.run(_live_async(bench, publisher, entries, pace, kind.endswith("one process")))
        return _checked(bench, publisher, kind)
    immediate = None
    dispatch_publisher: Any = publisher
    if kind != "stream only":
        immediate = ImmediateDispatcher(bench.store, publisher).start()
        if kind == "immediate, one process":
            dispatch_publisher = immediate.guard(publisher)
        elif kind.endswith("settled"):
            dispatch_publisher = SettledPublisher(publisher, MongoBackend(bench.coll), SETTLE)
    config, checkpoints = bench.resumed()
    dispatcher = Dispatcher(
        MongoBackend(bench.coll),
        dispatch_publisher,
        MemoryDeadLetters(),
        source=MongoChangeSource(bench.coll),
        checkpoints=checkpoints,
        config=config,
    )
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    dispatcher.started.wait(TIMEOUT)
    time.sleep(0.2)
    bench.produce(entries, pace)
    _wait(lambda: len(publisher.at) >= entries)
    if immediate is not None:
        immediate.drain()
    _wait(lambda: bench.coll.count_documents({"outbox.0": {"$exists": True}}) == 0)
    time.sleep(0.2)  # let a racing path finish what it started
    dispatcher.stop()
    thread.join(TIMEOUT)
    if immediate is not None:
        immediate.stop()
    return _checked(bench, publisher, kind)


async def _live_async(
    bench: Workbench, publisher: TimedPublisher, entries: int, pace: float, immediate: bool
) -> None:
    """The asyncio variants: producer, immediate path and dispatcher on one loop."""
    client: Any = AsyncMongoClient(
        "mongodb://{}:{}".format(*bench.coll.database.client.address),
        uuidRepresentation="standard",
    )
    coll = client[bench.coll.database.name][bench.coll.name]
    store = AsyncAggregateStore(AsyncMongoBackend(coll), Account)
    fast: Any = None
    dispatch_publisher: Any = AsyncMemoryPublisher(publisher)
    if immediate:
        fast = await AsyncImmediateDispatcher(store, AsyncMemoryPublisher(publisher)).start()
        dispatch_publisher = fast.guard(AsyncMemoryPublisher(publisher))
    config, checkpoints = bench.resumed()
    dispatcher = AsyncDispatcher(
        AsyncMongoBackend(coll),
        dispatch_publisher,
        in_thread(MemoryDeadLetters()),
        source=AsyncMongoChangeSource(coll),
        checkpoints=in_thread(checkpoints),
        config=config,
    )
    task = asyncio.get_running_loop().create_task(dispatcher.run())
    await asyncio.to_thread(dispatcher.started.wait, TIMEOUT)
    await asyncio.sleep(0.2)
    began = time.perf_counter()
    for index, (account, message) in enumerate(bench.feed.take(entries)):
        delay = began + index / pace - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        outcome = await store.handle(account, message, handlers)
        bench.committed[outcome.emitted[0].id] = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT
    while len(publisher.at) < entries or await coll.count_documents({"outbox.0": {"$exists": 1}}):
        if time.monotonic() > deadline:
            raise TimeoutError("the readers did not finish in time")
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.2)  # let a racing path finish what it started
    dispatcher.stop()
    await task
    if fast is not None:
        await fast.stop()
    await client.close()


def _checked(bench: Workbench, publisher: TimedPublisher, kind: str) -> tuple[list[float], float]:
    counts = Counter(publisher.ids())
    if set(counts) != set(bench.committed):
        raise AssertionError(f"{kind}: published {len(counts)} of {len(bench.committed)}")
    duplicates = (sum(counts.values()) - len(counts)) / len(counts)
    return [publisher.at[i] - at for i, at in bench.committed.items()], duplicates


def run(uri: str, scale: Scale) -> Table:
    client = connect(uri)
    entries, pace = max(10, scale.dispatch_entries // 4), 200.0
    rounds = min(scale.rounds, 3)
    latencies: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    duplicates: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        for index in range(scale.warmup + rounds):
            shift = index % len(KINDS)
            for kind in KINDS[shift:] + KINDS[:shift]:
                measured, dups = live(client, entries, pace, kind)
                if index >= scale.warmup:
                    latencies[kind].append(measured)
                    duplicates[kind].append(dups)
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    table = Table(
        "immediate",
        "Immediate dispatch: commit-to-publish latency and duplicates, against stream only",
        ["dispatch", "p50 ms", "p99 ms", "p50 vs stream", "p99 vs stream", "duplicates/msg"],
    )
    stats = {
        kind: (
            median([percentile(r, 50) for r in runs]) * 1000,
            median([percentile(r, 99) for r in runs]) * 1000,
        )
        for kind, runs in latencies.items()
    }
    for kind in KINDS:
        base = stats["asyncio: stream only" if kind.startswith("asyncio") else "stream only"]
        p50, p99 = stats[kind]
        dups = median(duplicates[kind])
        table.add(kind, p50, p99, f"{p50 / base[0]:.2f}x", f"{p99 / base[1]:.2f}x", f"{dups:.2%}")
        table.figures[kind] = {"p50_ms": p50, "p99_ms": p99, "duplicates_per_message": dups}
    table.notes += [
        f"{entries:,} commits (1 entry each, {LIVE_DENSITY} per aggregate) at {pace:.0f}/s "
        f"per round, {rounds} rounds, medians over rounds of each round's percentile. The "
        f"dispatcher polls its change stream and sleeps {POLL * 1000:.0f} ms when idle.",
        "duplicates/msg: publishes beyond the first, per entry. In one process the paths "
        "share claims (ImmediateDispatcher.guard); in two they race for every entry the "
        "stream sees before the immediate path has trimmed it; 'settled' wraps the other "
        f"process's publisher in SettledPublisher({SETTLE} s): young entries are published "
        "only if still pending once that old.",
        "Every entry is checked published at least once, and nothing is left pending.",
        "asyncio: the same on one event loop (AsyncAggregateStore on pymongo's "
        "AsyncMongoClient, AsyncDispatcher, AsyncImmediateDispatcher with guard); its "
        "ratios are against the asyncio stream only.",
    ]
    return table
