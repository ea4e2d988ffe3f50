"""What a Cosmos DB entry costs to dispatch: ``python -m benchmarks.cosmos_dispatch``.

Two workloads, each run by every contestant on its own container, in turn:

- **drain**: a backlog of aggregates with pending entries, dispatched from a position
  taken before it was written;
- **hot**: writers commit to every aggregate about once a second (one entry each time)
  while the dispatcher runs, then stop; the run ends when every entry is published.

Contestants (:mod:`benchmarks.cosmos_dispatchers`):

- ``hand-written``: :class:`HandWrittenDispatcher`, what a user writes with azure-cosmos
  alone: read a page of each feed range from its continuation, publish each item's new
  entries to memory, patch the item to remove them (if-match on the item's ``_etag``,
  re-read on 412), keep the continuation;
- ``dispatcher``: docoutbox's threaded Dispatcher as shipped (publish, then trim);
- ``publish-only``: the same dispatcher whose trims are not sent (:class:`PublishOnly`,
  benchmark-only): its ceiling. Nothing is trimmed, so the outboxes only grow;
- ``deferred trims (D s)``: the same dispatcher whose trims are held and coalesced per
  aggregate, each aggregate trimmed after D seconds or once 10 entries are held (what one
  patch removes), whichever comes first
  (:class:`DeferredTrims`, benchmark-only). It measures what deferred trims can save; it
  is not crash-safe (the checkpoint may pass entries whose trim is still held), which is
  why deferral belongs in the engine, behind the checkpoint rule.

Requests are counted from every response (change-feed pages and 304s included), by kind,
with the request charge each response reports (``x-ms-request-charge``). The local server
reports 1 RU for every request, whatever it does: there, RU per entry is requests per
entry, and only a real account gives real RU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import Scale, Table, median, paired_ratio, ratio_range
from benchmarks.cosmos import DEFAULT_OUT, SCALE, record
from benchmarks.cosmos_aio import AsyncNoDeadLetters, AsyncStartCheckpoints
from benchmarks.cosmos_common import cosmos_account, fill, new_container
from benchmarks.cosmos_dispatchers import (
    DeferredTrims,
    FeedMeter,
    HandWrittenDispatcher,
    KindMeter,
    MemorySink,
    PublishOnly,
)
from benchmarks.servers import CosmosAccount
from benchmarks.workload import Account, Feed, account_ids, handlers
from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.model import OutboxMessage
from docoutbox.testing.dispatch import MemoryCheckpoints
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource

NAMES = ["drain", "drain-1", "hot"]
#: The drain's poll interval once the feed is drained (as in benchmarks.cosmos's drain).
DRAIN_POLL = 0.005
HAND_WRITTEN = "hand-written"
DISPATCHER = "dispatcher"
PUBLISH_ONLY = "publish-only"
ASYNC = "AsyncDispatcher (azure.cosmos.aio)"
#: Seconds the emulated deferred trims hold an aggregate's trims, per contestant.
DEFERRED = {"deferred trims (5 s)": 5.0, "deferred trims (10 s)": 10.0}
#: The dispatcher with the engine's own deferred trims (``trim_delay``), per contestant.
TRIM_DELAY = {"dispatcher, trim_delay 5 s": 5.0}
CONTESTANTS = [HAND_WRITTEN, DISPATCHER, PUBLISH_ONLY, *DEFERRED, *TRIM_DELAY]
#: A drain shows each aggregate once: one deferral is enough there.
DRAIN_CONTESTANTS = [HAND_WRITTEN, DISPATCHER, ASYNC, PUBLISH_ONLY, "deferred trims (10 s)"]


@dataclass
class Scaled:
    """This module's own counts, for a full run and a quick one."""

    drain_aggregates: int = 200
    drain_per_aggregate: int = 10
    drain_rounds: int = 9
    hot_aggregates: int = 100
    hot_seconds: float = 30.0
    hot_rounds: int = 3
    writers: int = 2
    #: The drain of one entry per aggregate (``drain-1``): this many aggregates.
    single_aggregates: int = 1000

    @classmethod
    def quick(cls) -> Scaled:
        return cls(20, 3, 1, 10, 3.0, 1, 2, 30)


@dataclass
class Outcome:
    """One contestant's run: wall seconds, entries published, requests by kind, charge."""

    seconds: float
    published: int
    requests: Counter[str]
    charge: float
    lags: list[float] = field(default_factory=list)
    max_outbox: int = 0
    left: int = 0
    #: Hot workload: commits per second the writers made while the dispatcher ran.
    writes_per_s: float = 0.0
    #: Entries committed: what ``published`` must equal (no entry lost or published twice).
    expected: int = 0


def _backend(name: str, container: Any, meter: KindMeter) -> CosmosBackend:
    if name == PUBLISH_ONLY:
        return PublishOnly(container, on_charge=meter.on_charge)
    if name in DEFERRED:
        return DeferredTrims(container, delay=DEFERRED[name], on_charge=meter.on_charge)
    return CosmosBackend(container, on_charge=meter.on_charge)


class Running:
    """A contestant dispatching ``container`` from ``marker`` on a thread of its own."""

    def __init__(self, name: str, container: Any, marker: Any, poll_interval: float) -> None:
        self.name = name
        self.meter = KindMeter()
        self.sink = MemorySink()
        self._stop = threading.Event()
        self.backend: CosmosBackend | None = None
        self.dispatcher: Dispatcher | None = None
        if name == HAND_WRITTEN:
            hand = HandWrittenDispatcher(container, marker["ranges"], self.sink, self.meter)
            self.thread = threading.Thread(
                target=self._hand, args=(hand, poll_interval), daemon=True
            )
        else:
            checkpoints = MemoryCheckpoints()
            checkpoints.save("bench", marker)
            self.backend = _backend(name, container, self.meter)
            self.dispatcher = Dispatcher(
                self.backend,
                self.sink,
                MemoryDeadLetters(),
                source=CosmosChangeSource(FeedMeter(container, self.meter)),
                checkpoints=checkpoints,
                config=DispatcherConfig(
                    name="bench",
                    concurrency=8,
                    sweep_interval=3600,
                    poll_interval=poll_interval,
                    trim_delay=TRIM_DELAY.get(name, 0.0),
                ),
            )
            self.thread = threading.Thread(target=self.dispatcher.run, daemon=True)
        self.thread.start()

    def _hand(self, hand: HandWrittenDispatcher, poll_interval: float) -> None:
        while not self._stop.is_set():
            if not hand.poll():
                time.sleep(poll_interval)

    def wait_for(self, expected: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.sink.count < expected:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError(f"{self.name}: published {self.sink.count} of {expected}")
            time.sleep(0.002)

    def stop(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()  # finishes in-flight work, trims included
        self._stop.set()
        self.thread.join(60)
        if isinstance(self.backend, DeferredTrims):
            self.backend.flush()


def _outbox_lengths(container: Any) -> list[int]:
    return list(
        container.query_items(
            "SELECT VALUE ARRAY_LENGTH(c.outbox) FROM c", enable_cross_partition_query=True
        )
    )


def drain_once(
    database: Any, name: str, aggregates: int, per: int, account: CosmosAccount
) -> Outcome:
    container = new_container(database, "cdrain")
    try:
        marker = CosmosChangeSource(container).start_marker()
        fill(container, aggregates, per)
        if name == ASYNC:
            meter, sink = KindMeter(), MemorySink()
            seconds = asyncio.run(
                _aio_drain(
                    account, database.id, container.id, marker, aggregates * per, meter, sink
                )
            )
        else:
            began = time.perf_counter()
            running = Running(name, container, marker, DRAIN_POLL)
            running.wait_for(aggregates * per)
            seconds = time.perf_counter() - began
            running.stop()
            meter, sink = running.meter, running.sink
        lengths = _outbox_lengths(container)
        return Outcome(
            seconds,
            sink.count,
            meter.requests,
            meter.charge,
            max_outbox=max(lengths, default=0),
            left=sum(lengths),
            expected=aggregates * per,
        )
    finally:
        database.delete_container(container.id)


class _AsyncSink:
    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    async def publish(self, entry: OutboxMessage) -> None:
        self.sink.publish(entry)


async def _aio_drain(
    account: CosmosAccount,
    database: str,
    container: str,
    marker: Any,
    expected: int,
    meter: KindMeter,
    sink: MemorySink,
) -> float:
    """The AsyncDispatcher's drain on a client of its own; its wall time in seconds (from
    the dispatcher's start, the client already open)."""
    client = account.async_client()  # made inside the running loop
    try:
        aio = client.get_database_client(database).get_container_client(container)
        began = time.perf_counter()
        dispatcher = AsyncDispatcher(
            AsyncCosmosBackend(aio, on_charge=meter.on_charge),
            _AsyncSink(sink),
            AsyncNoDeadLetters(),
            source=AsyncCosmosChangeSource(FeedMeter(aio, meter)),
            checkpoints=AsyncStartCheckpoints(marker),
            config=DispatcherConfig(
                name="bench", concurrency=8, sweep_interval=3600, poll_interval=DRAIN_POLL
            ),
        )
        task = asyncio.ensure_future(dispatcher.run())
        while sink.count < expected:
            if task.done():
                await task
                raise AssertionError(f"{ASYNC}: published {sink.count} of {expected}")
            await asyncio.sleep(0.002)
        seconds = time.perf_counter() - began
        dispatcher.stop()  # finishes in-flight work, trims included
        await asyncio.wait_for(task, 60)
        return seconds
    finally:
        await client.close()


def hot_once(
    database: Any, name: str, scaled: Scaled, poll_interval: float | None = None
) -> Outcome:
    """Writers commit to every aggregate about once a second for ``hot_seconds`` while
    ``name`` dispatches (with ``poll_interval``, by default the dispatcher's); ends when
    every entry is published."""
    if poll_interval is None:
        poll_interval = DispatcherConfig().poll_interval
    container = new_container(database, "chot")
    try:
        accounts = account_ids(scaled.hot_aggregates)
        setup = AggregateStore(CosmosBackend(container), Account)
        for account in accounts:
            setup.create(account, Account())
        marker = CosmosChangeSource(container).start_marker()
        running = Running(name, container, marker, poll_interval)
        written = [0] * scaled.writers
        max_outbox = [0]
        stop = threading.Event()

        def write(index: int) -> None:
            mine = accounts[index :: scaled.writers]
            store = AggregateStore(CosmosBackend(container), Account)
            feed = Feed(mine, emit=True)
            began = time.monotonic()
            turn = 0
            while not stop.is_set():
                # Every aggregate once per second: the writer is on time or behind.
                ahead = began + turn / len(mine) - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                ((account, message),) = feed.take(1)
                if not store.handle(account, message, handlers).applied:
                    raise AssertionError(f"{account}: not applied")
                written[index] += 1
                turn += 1

        def sample() -> None:
            while not stop.wait(1.0):
                max_outbox[0] = max(max_outbox[0], *_outbox_lengths(container), 0)

        began = time.perf_counter()
        threads = [threading.Thread(target=write, args=(i,)) for i in range(scaled.writers)]
        threads.append(threading.Thread(target=sample))
        for t in threads:
            t.start()
        time.sleep(scaled.hot_seconds)
        stop.set()
        for t in threads:
            t.join()
        running.wait_for(sum(written))
        seconds = time.perf_counter() - began
        running.stop()
        lengths = _outbox_lengths(container)
        return Outcome(
            seconds,
            running.sink.count,
            running.meter.requests,
            running.meter.charge,
            lags=running.sink.lags,
            writes_per_s=sum(written) / scaled.hot_seconds,
            expected=sum(written),
            max_outbox=max(max_outbox[0], *lengths, 0),
            left=sum(lengths),
        )
    finally:
        database.delete_container(container.id)


def _sent(requests: Counter[str]) -> int:
    """Requests sent (``<kind> 412`` counts some of them again)."""
    return sum(n for kind, n in requests.items() if not kind.endswith(" 412"))


def _trims(requests: Counter[str]) -> int:
    """Requests sent for trims: the patches and the reads they needed."""
    return requests["patch"] + requests["read"]


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _table(key: str, title: str, outcomes: dict[str, list[Outcome]], *, hot: bool) -> Table:
    columns = [
        "contestant",
        "entries/s",
        "vs publish-only",
        "vs hand-written",
        "trim requests / entry",
        "requests / entry",
        "RU / entry",
        "max outbox",
    ]
    if hot:
        columns += ["lag p50 s", "lag p95 s", "writes/s"]
    table = Table(key, title, columns)
    rates = {n: [o.published / o.seconds for o in runs] for n, runs in outcomes.items()}
    for name, runs in outcomes.items():
        published = sum(o.published for o in runs)
        requests: Counter[str] = sum((o.requests for o in runs), Counter())
        charge = sum(o.charge for o in runs)
        lags = [lag for o in runs for lag in o.lags]
        ceiling = paired_ratio(rates[name], rates[PUBLISH_ONLY])
        hand = paired_ratio(rates[name], rates[HAND_WRITTEN])
        row: list[Any] = [
            name,
            median(rates[name]),
            f"{ceiling:.2f}x ({_range(rates[name], rates[PUBLISH_ONLY])})",
            f"{hand:.2f}x ({_range(rates[name], rates[HAND_WRITTEN])})",
            _trims(requests) / published,
            _sent(requests) / published,
            charge / published,
            max(o.max_outbox for o in runs),
        ]
        if hot:
            row += [
                _percentile(lags, 0.5),
                _percentile(lags, 0.95),
                median([o.writes_per_s for o in runs]),
            ]
        table.add(*row)
        table.figures[name] = {
            "per_s": median(rates[name]),
            "vs_publish_only": ceiling,
            "vs_hand_written": hand,
            "trim_requests_per_entry": _trims(requests) / published,
            "requests_per_entry": _sent(requests) / published,
            "requests_by_kind_per_entry": {k: v / published for k, v in requests.items()},
            "ru_per_entry": charge / published,
            "max_outbox": max(o.max_outbox for o in runs),
            "left_after_stop": sum(o.left for o in runs),
            "published": published,
            "published_more_than_once": published - sum(o.expected for o in runs),
            "rounds": len(runs),
            **(
                {
                    "lag_p50_s": _percentile(lags, 0.5),
                    "lag_p95_s": _percentile(lags, 0.95),
                    "writes_per_s": median([o.writes_per_s for o in runs]),
                }
                if hot
                else {}
            ),
        }
    table.figures["load_average_end"] = list(os.getloadavg())
    return table


def _range(candidate: list[float], baseline: list[float]) -> str:
    low, high = ratio_range(candidate, baseline)
    return f"{low:.2f}-{high:.2f}"


def drain(
    database: Any,
    account: CosmosAccount,
    scaled: Scaled,
    contestants: list[str] = DRAIN_CONTESTANTS,
    *,
    single: bool = False,
) -> Table:
    """The drain of ``drain_aggregates`` x ``drain_per_aggregate`` entries, or with
    ``single`` of ``single_aggregates`` x 1 (the shape of a backlog after an outage)."""
    aggregates, per = (
        (scaled.single_aggregates, 1)
        if single
        else (scaled.drain_aggregates, scaled.drain_per_aggregate)
    )
    outcomes: dict[str, list[Outcome]] = {n: [] for n in contestants}
    for index in range(scaled.drain_rounds + 1):  # the first round warms up
        shift = index % len(contestants)
        for name in contestants[shift:] + contestants[:shift]:
            outcome = drain_once(database, name, aggregates, per, account)
            if index:
                outcomes[name].append(outcome)
    table = _table(
        "cosmos_dispatch_drain_1" if single else "cosmos_dispatch_drain",
        f"Cosmos DB: drain of {aggregates} aggregates x {per} entries, per contestant",
        outcomes,
        hot=False,
    )
    table.notes.append(
        "Each contestant drains its own copy of the backlog, in turn (order rotated each "
        "round); ratios are medians of per-round ratios (range in brackets). Trim requests: "
        "patches and the reads they needed. RU: as the server reports (the local server "
        "reports 1 per request). max outbox: after the drain (publish-only trims nothing)."
    )
    return table


def hot(
    database: Any,
    _account: CosmosAccount,
    scaled: Scaled,
    contestants: list[str] = CONTESTANTS,
) -> Table:
    outcomes: dict[str, list[Outcome]] = {n: [] for n in contestants}
    for index in range(scaled.hot_rounds):
        shift = index % len(contestants)
        for name in contestants[shift:] + contestants[:shift]:
            outcomes[name].append(hot_once(database, name, scaled))
    table = _table(
        "cosmos_dispatch_hot",
        f"Cosmos DB: hot workload, {scaled.hot_aggregates} aggregates each written about "
        f"once a second for {scaled.hot_seconds:g} s while dispatching",
        outcomes,
        hot=True,
    )
    table.notes.append(
        f"{scaled.writers} writer threads commit one entry per write (docoutbox store, "
        "cached: one patch per write), every aggregate about once a second, in the same "
        "process as the dispatcher. entries/s: entries published / time from the first "
        "write to the last publish (the offered rate when the dispatcher keeps up). "
        "lag: publish time - entry created_at. max outbox: the longest outbox seen, sampled "
        "every second and at the end."
    )
    return table


def _alone(run: Callable[[Any, CosmosAccount, Scaled], Table], scale: Scale) -> Table:
    scaled = Scaled.quick() if scale == Scale.quick() else Scaled()
    with cosmos_account() as account, account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            table = run(database, account, scaled)
        finally:
            client.delete_database(database.id)
    table.figures["scale"] = scaled.__dict__
    return table


def drain_bench(_uri: str, scale: Scale) -> Table:
    """The drain alone (``scripts/bench --only cosmos_dispatch_drain``)."""
    return _alone(drain, scale)


def single_bench(_uri: str, scale: Scale) -> Table:
    """The drain of one entry per aggregate alone (``--only cosmos_dispatch_drain_1``)."""
    return _alone(partial(drain, single=True), scale)


def hot_bench(_uri: str, scale: Scale) -> Table:
    """The hot workload alone (``scripts/bench --only cosmos_dispatch_hot``)."""
    return _alone(hot, scale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cosmos_dispatch", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="tiny counts: proves the code runs")
    parser.add_argument("--only", nargs="+", choices=NAMES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    scaled = Scaled.quick() if args.quick else Scaled()
    began, load = time.perf_counter(), os.getloadavg()[0]
    tables = []
    with cosmos_account() as account, account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            if args.only is None or "drain" in args.only:
                tables.append(drain(database, account, scaled))
            if args.only is None or "drain-1" in args.only:
                tables.append(drain(database, account, scaled, single=True))
            if args.only is None or "hot" in args.only:
                tables.append(hot(database, account, scaled))
        finally:
            client.delete_database(database.id)
    for table in tables:
        print(table.to_markdown() + "\n", flush=True)
    scale = Scale.quick() if args.quick else SCALE
    for table in tables:
        table.figures["scale"] = scaled.__dict__
    record(tables, args.out, quick=args.quick, scale=scale, began=began, load=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
