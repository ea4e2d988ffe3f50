"""Benchmarks of batch handling and group commit (ratios, all variants in the same run).

- ``batch``: round trips per message and throughput of ``handle_batch`` with 1, 10 and
  100 messages per aggregate and call, against ``handle`` called per message on the same
  messages.
- ``group``: one hot aggregate under 16 concurrent writers (threads, and asyncio tasks),
  with and without group commit, against a single writer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from pymongo import AsyncMongoClient

from benchmarks.common import (
    CommandCounter,
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    ratio_range,
)
from benchmarks.workload import Account, Doc, Feed, account_ids, create_accounts, handlers
from docoutbox import AggregateStore, AsyncAggregateStore, Status
from docoutbox_mongo import AsyncMongoBackend, MongoBackend

BATCH_SIZES = (1, 10, 100)
WRITERS = 16


def _clear_outboxes(coll: Any) -> None:
    coll.update_many({}, {"$set": {"outbox": []}})


class BatchVariant:
    """Handles ``messages`` per round, ``size`` per aggregate and call (0: per message)."""

    def __init__(self, client: Any, size: int, messages: int) -> None:
        self.size = size
        self.per_call = size or 10
        self.accounts = account_ids(max(1, messages // self.per_call))
        self.coll = new_collection(client, f"batch_{size}")
        create_accounts(self.coll, self.accounts)
        self.store = AggregateStore(MongoBackend(self.coll), Account)
        self.feed = Feed(self.accounts, emit=True)
        self.handled = 0

    def messages(self) -> list[tuple[str, list[Doc]]]:
        calls = []
        for account in self.accounts:
            batch = self.feed.take(self.per_call)
            calls.append((account, [message for _, message in batch]))
        return calls

    def work(self, store: AggregateStore[Account]) -> Callable[[], int]:
        calls = self.messages()

        def run() -> int:
            count = 0
            for account, messages in calls:
                if self.size:
                    result = store.handle_batch(account, messages, handlers)
                    count += sum(r.applied for r in result.results)
                else:
                    for message in messages:
                        count += store.handle(account, message, handlers).applied
            return count

        return run

    def round(self) -> float:
        _clear_outboxes(self.coll)
        run = self.work(self.store)
        began = time.perf_counter()
        count = run()
        rate = count / (time.perf_counter() - began)
        self.handled += count
        return rate

    def round_trips(self, counted: Any, counter: CommandCounter) -> float:
        """Commands per message of one round, on a client that counts them."""
        _clear_outboxes(self.coll)
        coll = counted[self.coll.database.name][self.coll.name]
        store = AggregateStore(MongoBackend(coll), Account)
        run = self.work(store)
        run()  # warm the new store's cache, as a long-running process would be
        run = self.work(store)
        with counter.counting() as tally:
            count = run()
        self.handled += 2 * count
        return tally.round_trips / count


def batching(uri: str, scale: Scale) -> Table:
    client = connect(uri)
    counter = CommandCounter()
    counted = connect(uri, counter)
    messages = max(scale.messages, 100)
    try:
        variants = {"per message": BatchVariant(client, 0, messages)}
        for size in BATCH_SIZES:
            variants[f"batch {size}"] = BatchVariant(client, size, messages)
        trips = {name: v.round_trips(counted, counter) for name, v in variants.items()}
        samples = interleaved(
            {name: v.round for name, v in variants.items()}, scale.rounds, scale.warmup
        )
        for name, v in variants.items():
            total = sum(doc["state"]["deposits"] for doc in v.coll.find())
            if total != v.handled:
                raise AssertionError(f"{name}: {total} deposits stored, {v.handled} handled")
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
        counted.close()
    table = Table(
        "batch",
        "Batch handling: round trips per message and throughput against per-message handling",
        ["variant", "msgs per call", "round trips/msg", "msgs/s (median)", "vs per message", "IQR"],
    )
    base = samples["per message"]
    for name, v in variants.items():
        low, high = ratio_range(samples[name], base)
        table.add(
            name,
            v.per_call if v.size else 1,
            trips[name],
            median(samples[name]),
            f"{paired_ratio(samples[name], base):.2f}x",
            f"{low:.2f}-{high:.2f}",
        )
    table.figures = {"round_trips_per_message": trips, "rates": samples}
    table.notes += [
        f"{messages} Deposit messages per round, each emitting one entry; 'batch N' hands N "
        "messages of one aggregate to handle_batch per call; 'per message' calls handle for "
        "each of the same kind of messages (10 per aggregate). Stores are warm (cached).",
        "Round trips are every command the client sent in one counted round, per message. A "
        "batch's document holds its N new entries, and the cache keeps no copy with more than "
        "64 pending entries, so 'batch 100' reloads before each commit: 2 round trips per 100.",
        "Before each round (untimed) every outbox is emptied, as a dispatcher keeping up would.",
    ]
    return table


def _writer_threads(store: AggregateStore[Account], writers: int, per_writer: int) -> list[Any]:
    feeds = [Feed(["hot"], emit=False) for _ in range(writers)]
    batches = [feed.take(per_writer) for feed in feeds]
    outcomes: list[Any] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(batch: list[tuple[str, Doc]]) -> None:
        try:
            mine = [store.handle(account, message, handlers) for account, message in batch]
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            outcomes.extend(mine)

    threads = [threading.Thread(target=run, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outcomes


class HotThreads:
    def __init__(self, client: Any, writers: int, group: bool, messages: int) -> None:
        self.coll = new_collection(client, f"hot_{writers}_{group}")
        create_accounts(self.coll, ["hot"])
        self.store = AggregateStore(MongoBackend(self.coll), Account, group_commit=group)
        self.writers = writers
        self.per_writer = max(1, messages // writers)
        self.gave_up = 0
        self.writes = 0
        self.handled = 0

    def round(self) -> float:
        began = time.perf_counter()
        outcomes = _writer_threads(self.store, self.writers, self.per_writer)
        rate = len(outcomes) / (time.perf_counter() - began)
        self.gave_up += sum(o.status is Status.GAVE_UP for o in outcomes)
        self.writes += sum(o.attempts for o in outcomes)
        self.handled += sum(o.applied for o in outcomes)
        return rate


class HotTasks:
    """The same with asyncio tasks on one event loop (pymongo's AsyncMongoClient)."""

    def __init__(self, uri: str, client: Any, writers: int, group: bool, messages: int) -> None:
        self.coll = new_collection(client, f"hot_async_{writers}_{group}")
        create_accounts(self.coll, ["hot"])
        self.loop = asyncio.new_event_loop()
        self.aclient: Any = AsyncMongoClient(uri, uuidRepresentation="standard")
        backend = AsyncMongoBackend(self.aclient[self.coll.database.name][self.coll.name])
        self.store = AsyncAggregateStore(backend, Account, group_commit=group)
        self.writers = writers
        self.per_writer = max(1, messages // writers)
        self.gave_up = 0
        self.handled = 0

    async def _round(self) -> list[Any]:
        async def writer(batch: list[tuple[str, Doc]]) -> list[Any]:
            return [await self.store.handle(a, m, handlers) for a, m in batch]

        batches = [Feed(["hot"], emit=False).take(self.per_writer) for _ in range(self.writers)]
        done = await asyncio.gather(*(writer(b) for b in batches))
        return [o for batch in done for o in batch]

    def round(self) -> float:
        began = time.perf_counter()
        outcomes = self.loop.run_until_complete(self._round())
        rate = len(outcomes) / (time.perf_counter() - began)
        self.gave_up += sum(o.status is Status.GAVE_UP for o in outcomes)
        self.handled += sum(o.applied for o in outcomes)
        return rate

    def close(self) -> None:
        self.loop.run_until_complete(self.aclient.close())
        self.loop.close()


def group_commit(uri: str, scale: Scale) -> Table:
    client = connect(uri)
    messages = max(scale.messages // 2, WRITERS)
    tasks: list[HotTasks] = []
    try:
        variants: dict[str, Any] = {
            "threads: 1 writer": HotThreads(client, 1, False, messages),
            "threads: 1 writer, group commit": HotThreads(client, 1, True, messages),
            f"threads: {WRITERS} writers, group commit": HotThreads(
                client, WRITERS, True, messages
            ),
            f"threads: {WRITERS} writers, no group commit": HotThreads(
                client, WRITERS, False, messages
            ),
        }
        tasks = [
            HotTasks(uri, client, 1, False, messages),
            HotTasks(uri, client, WRITERS, True, messages),
            HotTasks(uri, client, WRITERS, False, messages),
        ]
        variants["tasks: 1 writer"] = tasks[0]
        variants[f"tasks: {WRITERS} writers, group commit"] = tasks[1]
        variants[f"tasks: {WRITERS} writers, no group commit"] = tasks[2]
        samples = interleaved(
            {name: v.round for name, v in variants.items()}, scale.rounds, scale.warmup
        )
        for name, v in variants.items():
            doc = v.coll.find_one({"_id": "hot"})
            if doc["state"]["deposits"] != v.handled:
                raise AssertionError(f"{name}: {doc['state']} after {v.handled} applied")
    finally:
        for t in tasks:
            t.close()
        client.drop_database("docoutbox_bench")
        client.close()
    table = Table(
        "group",
        f"One hot aggregate, {WRITERS} concurrent writers: group commit against one writer",
        ["variant", "msgs/s (median)", "vs 1 writer", "IQR", "retry limit exhausted"],
    )
    for name, v in variants.items():
        base = samples["tasks: 1 writer" if name.startswith("tasks") else "threads: 1 writer"]
        low, high = ratio_range(samples[name], base)
        table.add(
            name,
            median(samples[name]),
            f"{paired_ratio(samples[name], base):.2f}x",
            f"{low:.2f}-{high:.2f}",
            v.gave_up,
        )
    table.figures = {"rates": samples, "gave_up": {n: v.gave_up for n, v in variants.items()}}
    table.notes += [
        f"{messages} Deposit messages per round on one aggregate, split over the writers; "
        "each writer calls handle per message and waits for it. Default retry policy "
        "(10 attempts). 'retry limit exhausted' counts GAVE_UP outcomes over all rounds.",
        "With group commit the writers' messages queue while one write is in flight and go "
        "into the next write together; without it every writer loads, decides and races.",
        "'1 writer, group commit' is the option's cost when there is nobody to group with.",
    ]
    return table
