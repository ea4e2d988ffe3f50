"""The ``azure.cosmos.aio`` twins of the Cosmos DB handle and drain benchmarks.

Run with ``python -m benchmarks.cosmos --only handle-aio drain-aio`` (or
``scripts/bench --only cosmos_handle_aio cosmos_drain_aio``). Built like the sync ones in
:mod:`benchmarks.cosmos`, on the same account and the same item layout:

1. **handle throughput**: :class:`~docoutbox.AsyncAggregateStore` on
   :class:`~docoutbox_cosmos.AsyncCosmosBackend` vs a raw ``azure.cosmos.aio`` loop making
   the same write (read, then one patch guarded by ``version``; cached: the patch alone),
   messages one after the other, interleaved rounds, paired ratios; round trips and
   request units per message counted from every HTTP response;
2. **dispatch drain**: :class:`~docoutbox.dispatch.drivers.aio.AsyncDispatcher` (with
   :class:`~docoutbox_cosmos.AsyncCosmosChangeSource`, counting publisher, trims) vs a raw
   ``azure.cosmos.aio`` read of the same change feed, in entries per second.

All the async work of a benchmark runs on one event loop; each round is one
``run_until_complete``, so the rounds interleave exactly as the sync ones do.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from azure.cosmos import exceptions as cosmos_errors

from benchmarks.common import Scale, Table, interleaved, median, paired_ratio, ratio_range
from benchmarks.cosmos_common import (
    CountingPublisher,
    FeedCounter,
    Meter,
    cosmos_account,
    deposit,
    drain_table,
    fill,
    guarded_patch,
    handle_scale,
    make_accounts,
    new_container,
    paired_cell,
)
from benchmarks.servers import CosmosAccount
from benchmarks.workload import Account, Doc, Feed, handlers
from docoutbox import AsyncAggregateStore, InboxPolicy, StoreConfig
from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.ports.dispatch import Position
from docoutbox_cosmos import AsyncCosmosBackend
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource


class AsyncRawLoop:
    """:class:`benchmarks.cosmos.RawLoop`'s patch strategy on an ``azure.cosmos.aio``
    container."""

    def __init__(self, container: Any, meter: Meter, *, window: int, cached: bool) -> None:
        self.container = container
        self.meter = meter
        self.window = window
        self.cached = cached
        self._items: dict[str, Doc] = {}

    async def handle(self, account: str, message: Doc) -> None:
        item = self._items.pop(account, None)
        hook = {"raw_response_hook": self.meter.hook}
        while True:
            if item is None:
                item = await self.container.read_item(account, partition_key=account, **hook)
            if message["id"] in item["inbox"]:
                return
            new, inbox, now = deposit(item, message, self.window)
            try:
                written = await self.container.patch_item(
                    account, partition_key=account, **guarded_patch(item, new, inbox, now), **hook
                )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if exc.status_code != 412:
                    raise
                item = None
                continue
            if self.cached:
                self._items[account] = written
            return


@dataclass
class AsyncContestant:
    handle: Callable[[str, Doc], Coroutine[Any, Any, None]]
    feed: Feed
    meter: Meter
    messages: int
    loop: asyncio.AbstractEventLoop
    trips: list[float] = field(default_factory=list)
    charges: list[float] = field(default_factory=list)

    async def _handle_all(self, batch: list[tuple[str, Doc]]) -> None:
        for account, message in batch:
            await self.handle(account, message)

    def round(self) -> float:
        batch = self.feed.take(self.messages)
        responses, charge = self.meter.snapshot()
        start = time.perf_counter()
        self.loop.run_until_complete(self._handle_all(batch))
        elapsed = time.perf_counter() - start
        after, charged = self.meter.snapshot()
        self.trips.append((after - responses) / len(batch))
        self.charges.append((charged - charge) / len(batch))
        return len(batch) / elapsed


RAW_COLD, RAW_CACHED = "raw aio read + patch", "raw aio cached patch"


def handle_throughput(database: Any, account: CosmosAccount, scale: Scale) -> Table:
    """docoutbox's async store vs raw ``azure.cosmos.aio`` loops, same write, same rounds."""
    window = InboxPolicy().window
    loop = asyncio.new_event_loop()
    try:
        client = loop.run_until_complete(_open_client(account))
        try:
            aio_db = client.get_database_client(database.id)
            contestants: dict[str, AsyncContestant] = {}
            for name, cached in ((RAW_COLD, False), (RAW_CACHED, True)):
                container, accounts = make_accounts(database, "raw", scale)
                meter = Meter()
                raw = AsyncRawLoop(
                    aio_db.get_container_client(container.id), meter, window=window, cached=cached
                )
                contestants[name] = AsyncContestant(
                    raw.handle, Feed(accounts, emit=False), meter, scale.messages, loop
                )
            for name, cache in (
                ("docoutbox aio cold (cache off)", 0),
                ("docoutbox aio warm (cached)", 1024),
            ):
                container, accounts = make_accounts(database, "dox", scale)
                meter = Meter()
                backend = AsyncCosmosBackend(
                    aio_db.get_container_client(container.id), on_charge=meter.on_charge
                )
                store = AsyncAggregateStore(backend, Account, StoreConfig(cache_size=cache))
                contestants[name] = AsyncContestant(
                    _store_handle(store), Feed(accounts, emit=False), meter, scale.messages, loop
                )
            samples = interleaved(
                {name: c.round for name, c in contestants.items()}, scale.rounds, scale.warmup
            )
        finally:
            loop.run_until_complete(client.close())
    finally:
        loop.close()
    table = Table(
        "cosmos_handle_aio",
        "Cosmos DB, azure.cosmos.aio: AsyncAggregateStore vs a raw aio loop doing the same "
        f"write (window {window})",
        [
            "variant",
            "round trips / msg",
            "RU / msg",
            "msgs/s",
            f"vs {RAW_COLD}",
            f"vs {RAW_CACHED}",
        ],
    )
    for name, c in contestants.items():
        trips, charge = median(c.trips), median(c.charges)
        table.add(
            name,
            trips,
            charge,
            median(samples[name]),
            paired_cell(samples, name, RAW_COLD),
            paired_cell(samples, name, RAW_CACHED),
        )
        table.figures[name] = {
            "per_s": median(samples[name]),
            "round_trips_per_message": trips,
            "request_units_per_message": charge,
            "vs_raw": paired_ratio(samples[name], samples[RAW_COLD]),
            "vs_raw_iqr": list(ratio_range(samples[name], samples[RAW_COLD])),
            "vs_raw_cached": paired_ratio(samples[name], samples[RAW_CACHED]),
            "vs_raw_cached_iqr": list(ratio_range(samples[name], samples[RAW_CACHED])),
        }
    table.notes.append(
        "Messages are handled one after the other on one event loop, like the sync loops: "
        "like for like, cold vs raw aio read + patch (2 round trips each), warm vs raw aio "
        "cached patch (1 each). Target: docoutbox >= 0.85x its raw counterpart."
    )
    return table


def _store_handle(
    store: AsyncAggregateStore[Account],
) -> Callable[[str, Doc], Coroutine[Any, Any, None]]:
    async def handle(account: str, message: Doc) -> None:
        if not (await store.handle(account, message, handlers)).applied:
            raise AssertionError(f"{account}: message {message['id']} not applied")

    return handle


async def _open_client(account: CosmosAccount) -> Any:
    return account.async_client()  # the aio client must be made inside the running loop


class AsyncCountingPublisher:
    def __init__(self) -> None:
        self.counter = CountingPublisher()

    async def publish(self, entry: Any) -> None:
        self.counter.publish(entry)


class AsyncNoDeadLetters:
    """The drain quarantines nothing; an entry that gets here fails the benchmark."""

    async def put(
        self, aggregate_id: Any, entry: dict[str, Any], error: str, attempts: int
    ) -> None:
        raise AssertionError(f"quarantined {aggregate_id!r}: {error}")


class AsyncStartCheckpoints:
    """Starts the dispatcher at ``marker``; keeps what it saves in memory."""

    def __init__(self, marker: Position) -> None:
        self.positions: dict[str, Position] = {"bench": marker}

    async def load(self, name: str) -> Position | None:
        return self.positions.get(name)

    async def save(self, name: str, position: Position) -> None:
        self.positions[name] = position


async def raw_feed_read(container: Any, marker: Position, meter: Meter) -> int:
    """Entries in every item of the aio change feed after ``marker``, read page by page."""
    source = AsyncCosmosChangeSource(FeedCounter(container, meter))
    await source.open(marker)
    entries = 0
    while events := await source.poll(1000):
        entries += sum(len((e.document or {}).get("outbox") or ()) for e in events)
    return entries


async def dispatcher_drain(container: Any, marker: Position, expected: int, meter: Meter) -> None:
    publisher = AsyncCountingPublisher()
    dispatcher = AsyncDispatcher(
        AsyncCosmosBackend(container, on_charge=meter.on_charge),
        publisher,
        AsyncNoDeadLetters(),
        source=AsyncCosmosChangeSource(FeedCounter(container, meter)),
        checkpoints=AsyncStartCheckpoints(marker),
        config=DispatcherConfig(
            name="bench", concurrency=8, sweep_interval=3600, poll_interval=0.005
        ),
    )
    task = asyncio.ensure_future(dispatcher.run())
    deadline = time.monotonic() + 600
    while publisher.counter.count < expected:
        if time.monotonic() > deadline or task.done():
            dispatcher.stop()
            await asyncio.gather(task, return_exceptions=True)
            raise AssertionError(f"dispatcher published {publisher.counter.count} of {expected}")
        await asyncio.sleep(0.002)
    dispatcher.stop()  # finishes in-flight work: every trim is done when run() returns
    await asyncio.wait_for(task, 60)
    if publisher.counter.count != expected:
        raise AssertionError(f"published {publisher.counter.count}, expected {expected}")


def drain(database: Any, account: CosmosAccount, scale: Scale) -> Table:
    """AsyncDispatcher vs a raw aio change-feed read of the same backlog, round by round."""
    per_doc = 10
    docs = max(2, scale.dispatch_entries // per_doc)
    raw_rates, dispatch_rates, raw_trips, dispatch_trips = [], [], [], []
    loop = asyncio.new_event_loop()
    try:
        client = loop.run_until_complete(_open_client(account))
        try:
            aio_db = client.get_database_client(database.id)
            for _ in range(scale.warmup + max(1, scale.rounds // 2)):
                container = new_container(database, "drain_aio")
                marker = CosmosChangeSource(container).start_marker()
                fill(container, docs, per_doc)
                aio = aio_db.get_container_client(container.id)
                raw_meter, dispatch_meter = Meter(), Meter()
                # The raw read first: the dispatcher's trims leave the feed's items empty.
                start = time.perf_counter()
                entries = loop.run_until_complete(raw_feed_read(aio, marker, raw_meter))
                raw_rate = entries / (time.perf_counter() - start)
                if entries != docs * per_doc:
                    raise AssertionError(f"raw read saw {entries} of {docs * per_doc} entries")
                start = time.perf_counter()
                loop.run_until_complete(dispatcher_drain(aio, marker, entries, dispatch_meter))
                dispatch_rate = entries / (time.perf_counter() - start)
                left = list(
                    container.query_items(
                        "SELECT VALUE c.id FROM c WHERE ARRAY_LENGTH(c.outbox) > 0",
                        enable_cross_partition_query=True,
                    )
                )
                if left:
                    raise AssertionError(f"{len(left)} aggregates still pending after the drain")
                raw_rates.append(raw_rate)
                dispatch_rates.append(dispatch_rate)
                raw_trips.append(raw_meter.snapshot()[0])
                dispatch_trips.append(dispatch_meter.snapshot()[0])
                database.delete_container(container.id)
        finally:
            loop.run_until_complete(client.close())
    finally:
        loop.close()
    table = drain_table(
        "cosmos_drain_aio",
        "Cosmos DB, azure.cosmos.aio: AsyncDispatcher drain vs a raw aio change-feed read "
        f"({docs} aggregates x {per_doc})",
        ("raw aio change-feed read", "AsyncDispatcher: publish + trim"),
        docs * per_doc,
        (raw_rates[scale.warmup :], raw_trips[scale.warmup :]),
        (dispatch_rates[scale.warmup :], dispatch_trips[scale.warmup :]),
    )
    table.notes.append(
        "Same backlog and method as the sync drain, on one event loop: the raw read pages "
        "through the aio change feed; the AsyncDispatcher reads the same feed, publishes "
        "from the feed's copies (counting publisher) and trims each item. Requests are "
        "counted from every response, 304s included. Target: >= 0.7x."
    )
    return table


def handle_bench(_uri: str, scale: Scale) -> Table:
    """The aio handle benchmark alone (``scripts/bench --only cosmos_handle_aio``), at the
    sync handle benchmark's scale; ``_uri`` (a MongoDB server) is not used."""
    with cosmos_account() as account, account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            return handle_throughput(database, account, handle_scale(scale))
        finally:
            client.delete_database(database.id)


def drain_bench(_uri: str, scale: Scale) -> Table:
    """The aio drain benchmark alone (``scripts/bench --only cosmos_drain_aio``)."""
    with cosmos_account() as account, account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            return drain(database, account, scale)
        finally:
            client.delete_database(database.id)
