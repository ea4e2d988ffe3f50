"""Benchmarks 2-4: handle throughput as ratios, all variants interleaved on one server.

2. the cost of the inbox (window 0 / 100 / 1000 IDs, exact watermarks);
3. docoutbox against a raw pymongo find-then-update loop doing the same update;
4. the per-document outbox against the classic separate-outbox-collection pattern.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from benchmarks.common import (
    CommandCounter,
    Round,
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    ratio_range,
    timed_rate,
)
from benchmarks.workload import (
    Classic,
    Doc,
    Feed,
    RawLoop,
    account_ids,
    create_accounts,
    handlers,
    make_store,
    prefill,
)
from docoutbox import AggregateStore, InboxPolicy, StoreConfig
from docoutbox_mongo import MongoBackend

Handle = Callable[[str, Doc], Any]
SOURCES = 10
PREFILLED_HW = 1000


def _store_handle(store: AggregateStore[Any]) -> Handle:
    def handle(account: str, message: Doc) -> None:
        if not store.handle(account, message, handlers).applied:
            raise AssertionError(f"{account}: message {message['id']} not applied")

    return handle


class Variant:
    """One contestant: a handle function fed by its own accounts and messages."""

    def __init__(
        self,
        handle: Handle,
        feed: Feed,
        scale: Scale,
        *,
        before: Callable[[], None] | None = None,
        collection: Any = None,
    ) -> None:
        self.handle = handle
        self.feed = feed
        self.count = scale.messages
        self.before = before
        self.collection = collection
        self.handled = 0
        #: Client CPU per message, in microseconds, per round (process time: this
        #: process only, so the server's work and other processes' load are left out).
        self.cpu_us: list[float] = []

    def round(self) -> float:
        if self.before is not None:
            self.before()
        batch = self.feed.take(self.count)
        handle = self.handle

        def work() -> None:
            for account, message in batch:
                handle(account, message)

        cpu = time.process_time()
        rate = timed_rate(len(batch), work)
        self.cpu_us.append((time.process_time() - cpu) / max(1, len(batch)) * 1e6)
        self.handled += len(batch)
        return rate

    def verify(self, field: str = "state.deposits") -> None:
        """Every handled message changed the state exactly once."""
        if self.collection is None:
            return
        total = sum(_dig(doc, field) for doc in self.collection.find({}))
        if total != self.handled:
            raise AssertionError(f"{total} deposits recorded, {self.handled} handled")


def _dig(doc: Doc, path: str) -> int:
    value: Any = doc
    for key in path.split("."):
        value = value[key]
    assert isinstance(value, int)
    return value


def _accounts(client: Any, prefix: str, scale: Scale) -> tuple[Any, list[str]]:
    coll = new_collection(client, prefix)
    accounts = account_ids(scale.aggregates)
    create_accounts(coll, accounts)
    return coll, accounts


def _rounds(variants: dict[str, Variant], scale: Scale) -> dict[str, list[float]]:
    plan: dict[str, Round] = {name: v.round for name, v in variants.items()}
    samples = interleaved(plan, scale.rounds, scale.warmup)
    for variant in variants.values():
        variant.verify()
    return samples


def _ratio_cell(samples: dict[str, list[float]], name: str, base: str) -> str:
    low, high = ratio_range(samples[name], samples[base])
    return f"{paired_ratio(samples[name], samples[base]):.2f}x ({low:.2f}-{high:.2f})"


POLICIES: dict[str, InboxPolicy] = {
    "window 0": InboxPolicy(window=0),
    "window 100": InboxPolicy(window=100),
    "window 1000": InboxPolicy(window=1000),
    f"exact, {SOURCES} sources": InboxPolicy(window=0, exact=True),
}


def inbox_cost(uri: str, scale: Scale) -> Table:
    """Benchmark 2: throughput and bytes per commit by inbox policy, relative to window 0."""
    client, counter = connect(uri), CommandCounter()
    counted = connect(uri, counter)
    variants: dict[str, Variant] = {}
    feeds: dict[str, tuple[Any, Feed]] = {}
    try:
        for name, policy in POLICIES.items():
            sources = SOURCES if policy.exact else 0
            for mode, cache in (("warm", 1024), ("cold", 0)):
                coll, accounts = _accounts(client, "inbox", scale)
                prefill(coll, accounts, window=policy.window, sources=sources, hw=PREFILLED_HW)
                feed = Feed(accounts, emit=False, sources=sources, first_seq=PREFILLED_HW + 1)
                config = StoreConfig(inbox=policy, cache_size=cache)
                store = make_store(coll, config)
                variants[f"{name} {mode}"] = Variant(
                    _store_handle(store), feed, scale, collection=coll
                )
                if mode == "warm":
                    feeds[name] = (counted[coll.database.name][coll.name], feed)
        for window in (0, 100, 1000):
            coll, accounts = _accounts(client, "inbox_raw", scale)
            prefill(coll, accounts, window=window, sources=0, hw=0)
            raw = RawLoop(coll, window=window)
            variants[f"raw window {window}"] = Variant(
                raw.handle, Feed(accounts, emit=False), scale, collection=coll
            )
        samples = _rounds(variants, scale)
        sizes = {name: _bytes_per_commit(counter, *feeds[name], POLICIES[name]) for name in feeds}
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
        counted.close()
    return _inbox_table(samples, sizes)


def _bytes_per_commit(
    counter: CommandCounter, coll: Any, feed: Feed, policy: InboxPolicy
) -> tuple[float, float]:
    """(update command bytes, document bytes) in the steady state of ``coll``."""
    store = make_store(coll, StoreConfig(inbox=policy))
    for account, message in feed.take(len(feed.accounts)):
        store.handle(account, message, handlers)
    with counter.counting() as tally:
        for account, message in feed.take(len(feed.accounts)):
            store.handle(account, message, handlers)
    assert tally.commands["update"] == tally.round_trips == len(feed.accounts)
    doc = coll.find_one({"_id": feed.accounts[0]})
    return tally.sent["update"] / tally.round_trips, float(MongoBackend(coll).document_size(doc))


def _inbox_table(samples: dict[str, list[float]], sizes: dict[str, tuple[float, float]]) -> Table:
    table = Table(
        "inbox",
        "Cost of the inbox: handle throughput by inbox policy (no emitted messages)",
        [
            "inbox policy",
            "warm msgs/s",
            "warm vs window 0",
            "cold msgs/s",
            "cold vs window 0",
            "commit bytes",
            "document bytes",
        ],
    )
    for name in POLICIES:
        warm, cold = f"{name} warm", f"{name} cold"
        table.add(
            name,
            median(samples[warm]),
            _ratio_cell(samples, warm, "window 0 warm"),
            median(samples[cold]),
            _ratio_cell(samples, cold, "window 0 cold"),
            sizes[name][0],
            sizes[name][1],
        )
        table.figures[name] = {
            "warm_per_s": median(samples[warm]),
            "warm_ratio": paired_ratio(samples[warm], samples["window 0 warm"]),
            "cold_per_s": median(samples[cold]),
            "cold_ratio": paired_ratio(samples[cold], samples["window 0 cold"]),
            "commit_bytes": sizes[name][0],
            "document_bytes": sizes[name][1],
        }
    for window in (0, 100, 1000):
        name = f"raw window {window}"
        table.add(
            f"raw pymongo loop, window {window}",
            "-",
            "-",
            median(samples[name]),
            _ratio_cell(samples, name, "raw window 0"),
            "-",
            "-",
        )
        table.figures[name] = {
            "cold_per_s": median(samples[name]),
            "cold_ratio": paired_ratio(samples[name], samples["raw window 0"]),
        }
    raw_1000 = paired_ratio(samples["raw window 1000"], samples["raw window 100"])
    table.figures["raw_1000_vs_100"] = raw_1000
    table.notes += [
        "warm: the store's document cache holds the aggregate, so a message is one update; "
        "cold: cache off, so every message is a find plus an update.",
        "Inboxes are pre-filled to the window (exact: 10 sources with a watermark at 1000) "
        "before measuring, so every commit evicts an ID as in the steady state.",
        f"Raw loop, window 1000 vs window 100 in this run: {raw_1000:.2f}x.",
    ]
    return table


#: How many times the usual rounds :func:`versus_raw` runs.
RAW_ROUNDS = 3


def versus_raw(uri: str, scale: Scale) -> Table:
    """Benchmark 3: docoutbox against the same update written by hand.

    ``RAW_ROUNDS`` times the usual rounds: a round takes a fraction of a second, and the
    spread between rounds on a shared server is wider than the gap being measured.
    """
    scale = replace(scale, rounds=scale.rounds * RAW_ROUNDS)
    client = connect(uri)
    window = InboxPolicy().window
    variants: dict[str, Variant] = {}
    try:
        for name, cached in (("raw find + update", False), ("raw cached update", True)):
            coll, accounts = _accounts(client, "raw", scale)
            loop = RawLoop(coll, window=window, cached=cached)
            variants[name] = Variant(
                loop.handle, Feed(accounts, emit=False), scale, collection=coll
            )
        for name, cache in (("docoutbox cold (cache off)", 0), ("docoutbox warm (cached)", 1024)):
            coll, accounts = _accounts(client, "dox", scale)
            store = make_store(coll, StoreConfig(cache_size=cache))
            variants[name] = Variant(
                _store_handle(store), Feed(accounts, emit=False), scale, collection=coll
            )
        samples = _rounds(variants, scale)
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    table = Table(
        "raw",
        f"docoutbox vs a raw pymongo loop doing the same update (inbox window {window})",
        [
            "variant",
            "round trips / msg",
            "msgs/s",
            "vs raw find + update",
            "vs raw cached update",
            "client CPU µs/msg",
            "client CPU vs its raw loop",
        ],
    )
    trips = {"raw find + update": 2, "raw cached update": 1}
    trips |= {"docoutbox cold (cache off)": 2, "docoutbox warm (cached)": 1}
    # Like for like: the cold store against the find + update loop, the warm one against
    # the cached loop. CPU ratios are raw / docoutbox, so 1.00x means no extra client CPU.
    peer = {
        "raw find + update": "raw find + update",
        "raw cached update": "raw cached update",
        "docoutbox cold (cache off)": "raw find + update",
        "docoutbox warm (cached)": "raw cached update",
    }
    cpu = {
        name: variant.cpu_us[scale.warmup :] or variant.cpu_us for name, variant in variants.items()
    }
    for name in variants:
        base_cpu = cpu[peer[name]]
        cpu_ratio = paired_ratio(base_cpu, cpu[name])
        low, high = ratio_range(base_cpu, cpu[name])
        table.add(
            name,
            trips[name],
            median(samples[name]),
            _ratio_cell(samples, name, "raw find + update"),
            _ratio_cell(samples, name, "raw cached update"),
            round(median(cpu[name]), 1),
            f"{cpu_ratio:.2f}x ({low:.2f}-{high:.2f})",
        )
        table.figures[name] = {
            "per_s": median(samples[name]),
            "vs_raw": paired_ratio(samples[name], samples["raw find + update"]),
            "vs_raw_cached": paired_ratio(samples[name], samples["raw cached update"]),
            "client_cpu_us": median(cpu[name]),
            "client_cpu_vs_raw": cpu_ratio,
        }
    table.notes.append(
        "Like for like: cold vs raw find + update (2 round trips each), warm vs raw cached "
        "update (1 round trip each). Target: docoutbox >= 0.85x its raw counterpart. "
        f"{scale.rounds} rounds of {scale.messages} messages per variant."
    )
    return table


def versus_classic(uri: str, scale: Scale) -> Table:
    """Benchmark 4: one document write vs the classic separate outbox collection."""
    client = connect(uri)
    variants: dict[str, Variant] = {}
    try:
        for name, processed in (
            ("classic, 4 round trips", True),
            ("classic, 3 round trips", False),
        ):
            classic = Classic(client, "classic", processed=processed)
            accounts = account_ids(scale.aggregates)
            classic.seed(accounts)
            variants[name] = Variant(
                classic.handle,
                Feed(accounts, emit=True),
                scale,
                before=classic.clear_outbox,
                collection=classic.aggregates,
            )
        for name, cache in (("docoutbox cold (cache off)", 0), ("docoutbox warm (cached)", 1024)):
            coll, accounts = _accounts(client, "outbox", scale)
            store = make_store(coll, StoreConfig(cache_size=cache))
            variants[name] = Variant(
                _store_handle(store),
                Feed(accounts, emit=True),
                scale,
                before=_trimmer(coll),
                collection=coll,
            )
        samples = _rounds(variants, scale)
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    base = "classic, 4 round trips"
    table = Table(
        "outbox",
        "Per-document outbox vs a separate outbox collection (1 emitted message each)",
        ["variant", "round trips / msg", "msgs/s", "vs classic (4 round trips)"],
    )
    trips = {base: 4, "classic, 3 round trips": 3}
    trips |= {"docoutbox cold (cache off)": 2, "docoutbox warm (cached)": 1}
    for name in variants:
        table.add(name, trips[name], median(samples[name]), _ratio_cell(samples, name, base))
        table.figures[name] = {
            "per_s": median(samples[name]),
            "vs_classic": paired_ratio(samples[name], samples[base]),
        }
    table.notes += [
        "classic, 4: insert a processed-message marker, load, version-guarded update, insert "
        "the outbox entry; classic, 3: the same without the marker (no de-duplication).",
        "Between rounds (untimed) every outbox is emptied, as a dispatcher keeping up would: "
        "a $set of the outbox that leaves version alone, and a delete of the outbox rows.",
    ]
    return table


def _trimmer(coll: Any) -> Callable[[], None]:
    def trim() -> None:
        coll.update_many({}, {"$set": {"outbox": []}})

    return trim


TRIM_EVERY = 50


def hot_aggregate(uri: str, scale: Scale) -> Table:
    """One busy aggregate, one entry per message, trimmed every 50 messages as a dispatcher
    keeping up would: warm (cached) store against cold (cache off), segment by segment."""
    client = connect(uri)
    size = max(1, round(scale.messages * 5 / 3 / TRIM_EVERY)) * TRIM_EVERY
    segments = scale.hot_segments
    rates: dict[str, list[float]] = {"warm": [], "cold": []}
    try:
        runs = {}
        for mode, cache in (("warm", 1024), ("cold", 0)):
            coll = new_collection(client, f"hot_{mode}")
            create_accounts(coll, ["hot"])
            store = make_store(coll, StoreConfig(cache_size=cache))
            runs[mode] = (store, make_store(coll), Feed(["hot"], emit=True), coll)
        if scale.warmup:
            _warm_up_server(client, size)
        for segment in range(segments):
            for mode in ("warm", "cold") if segment % 2 == 0 else ("cold", "warm"):
                store, trimmer, feed, _ = runs[mode]
                rates[mode].append(_hot_segment(store, trimmer, feed, size))
        for *_, coll in runs.values():
            state = coll.find_one({"_id": "hot"})
            if state["state"]["deposits"] != size * segments or state["outbox"]:
                raise AssertionError(f"hot aggregate ended as {state['state']}")
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    table = Table(
        "hot",
        "One hot aggregate with a dispatcher trimming behind the store: warm vs cold",
        ["messages", "warm msgs/s", "cold msgs/s", "warm vs cold", "warm vs its first segment"],
    )
    for index, (warm, cold) in enumerate(zip(rates["warm"], rates["cold"], strict=True)):
        table.add(
            f"{index * size + 1:,}-{(index + 1) * size:,}",
            warm,
            cold,
            f"{warm / cold:.2f}x",
            f"{warm / rates['warm'][0]:.2f}x",
        )
    table.figures = {"warm": rates["warm"], "cold": rates["cold"]}
    table.notes += [
        f"Every {TRIM_EVERY} messages (untimed) the published entries are trimmed with "
        "AggregateStore.trim from another store instance, as the dispatcher does. A trim "
        "does not change the version, so the handling store's cached copy stays current "
        "and never sees the trims.",
    ]
    return table


def _hot_segment(store: Any, trimmer: Any, feed: Feed, size: int) -> float:
    spent = 0.0
    for _ in range(0, size, TRIM_EVERY):
        batch = feed.take(TRIM_EVERY)
        emitted: list[str] = []
        began = time.perf_counter()
        for account, message in batch:
            outcome = store.handle(account, message, handlers)
            emitted.extend(entry.id for entry in outcome.emitted)
        spent += time.perf_counter() - began
        if not trimmer.trim("hot", emitted):
            raise AssertionError("trim found no aggregate")
    return size / spent


def _warm_up_server(client: Any, size: int) -> None:
    """Untimed: the same work on a throwaway aggregate, so the server's JIT is warm."""
    coll = new_collection(client, "hot_warmup")
    create_accounts(coll, ["hot"])
    for cache in (1024, 0):
        _hot_segment(
            make_store(coll, StoreConfig(cache_size=cache)),
            make_store(coll),
            Feed(["hot"], emit=True),
            size,
        )
