"""Benchmark 1: round trips and bytes per handled message, counted by command monitoring.

These figures do not depend on the server's speed: they are what docoutbox sends, and
what the classic three-collection pattern sends for the same business step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from benchmarks.common import CommandCounter, Scale, Table, Tally, connect, new_collection
from benchmarks.workload import (
    Classic,
    Doc,
    Feed,
    account_ids,
    create_accounts,
    handlers,
    make_store,
)
from docoutbox import StoreConfig

Handle = Callable[[str, Doc], Any]


def _count(counter: CommandCounter, batch: list[tuple[str, Doc]], handle: Handle) -> Tally:
    with counter.counting() as tally:
        for account, message in batch:
            handle(account, message)
    return tally


def _store_handle(store: Any, *, create: bool = False, expect: str = "applied") -> Handle:
    def handle(account: str, message: Doc) -> None:
        outcome = store.handle(account, message, handlers, create=create)
        if outcome.status != expect:
            raise AssertionError(f"{account}: {outcome.status}, expected {expect}")

    return handle


def run(uri: str, scale: Scale) -> Table:
    counter = CommandCounter()
    client = connect(uri, counter)
    accounts = account_ids(scale.aggregates)
    count = max(len(accounts) * 2, min(scale.messages, 100))
    tallies: dict[str, Tally] = {}
    try:
        # docoutbox, cache off: every message loads the document, then commits.
        coll = new_collection(client, "s_cold")
        create_accounts(coll, accounts)
        cold = make_store(coll, StoreConfig(cache_size=0))
        batch = Feed(accounts, emit=True).take(count)
        tallies["docoutbox, aggregate not cached (load + commit)"] = _count(
            counter, batch, _store_handle(cold)
        )
        tallies["docoutbox, redelivered, not cached"] = _count(
            counter, batch, _store_handle(cold, expect="duplicate")
        )

        # docoutbox, cached and current: the commit alone.
        coll = new_collection(client, "s_warm")
        create_accounts(coll, accounts)
        warm = make_store(coll)
        feed = Feed(accounts, emit=True)
        for account, message in feed.take(len(accounts)):
            warm.handle(account, message, handlers)
        batch = feed.take(count)
        tallies["docoutbox, aggregate cached and current"] = _count(
            counter, batch, _store_handle(warm)
        )
        tallies["docoutbox, redelivered, cached"] = _count(
            counter, batch, _store_handle(warm, expect="duplicate")
        )

        # Two processes taking turns on each aggregate: every cached copy is stale.
        coll = new_collection(client, "s_stale")
        create_accounts(coll, accounts)
        stores = (make_store(coll), make_store(coll))
        feed = Feed(accounts, emit=True)
        for store in stores:
            for account, message in feed.take(len(accounts)):
                store.handle(account, message, handlers)
        handles = [_store_handle(store) for store in stores]
        visits: Counter[str] = Counter()

        def alternate(account: str, message: Doc) -> None:
            turn = visits[account]
            visits[account] += 1
            handles[turn % 2](account, message)

        tallies["docoutbox, cached copy stale (another writer)"] = _count(
            counter, feed.take(count), alternate
        )

        # First message of an aggregate that does not exist yet.
        coll = new_collection(client, "s_create")
        fresh = make_store(coll)
        batch = Feed(account_ids(count), emit=True).take(count)
        tallies["docoutbox, first message creates the aggregate"] = _count(
            counter, batch, _store_handle(fresh, create=True)
        )

        for processed, label in ((True, "processed marker + "), (False, "")):
            classic = Classic(client, "s_classic", processed=processed)
            classic.seed(accounts)
            batch = Feed(accounts, emit=True).take(count)
            name = f"classic: {label}load + update + outbox insert"
            tallies[name] = _count(counter, batch, classic.handle)
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    return _table(tallies, count)


def _table(tallies: dict[str, Tally], count: int) -> Table:
    table = Table(
        "structure",
        "Round trips and bytes per handled message (1 emitted message each, inbox window 100)",
        [
            "variant",
            "round trips / msg",
            "commands / msg",
            "bytes sent / msg",
            "write bytes / msg",
            "bytes received / msg",
            "round trips vs classic",
            "write bytes vs classic",
        ],
    )
    classic = tallies["classic: processed marker + load + update + outbox insert"]
    classic_writes = (classic.bytes_sent - classic.sent["find"]) / count
    for name, tally in tallies.items():
        writes = (tally.bytes_sent - tally.sent["find"]) / count
        commands = ", ".join(
            f"{cmd} {n / count:.2f}".rstrip("0").rstrip(".")
            for cmd, n in sorted(tally.commands.items())
        )
        table.add(
            name,
            tally.round_trips / count,
            commands or "none",
            tally.bytes_sent / count,
            writes,
            tally.received / count,
            f"{tally.round_trips / classic.round_trips:.2f}x",
            f"{writes / classic_writes:.2f}x" if writes else "-",
        )
        table.figures[name] = {
            "round_trips_per_message": tally.round_trips / count,
            "commands": {cmd: n / count for cmd, n in tally.commands.items()},
            "bytes_sent_per_message": tally.bytes_sent / count,
            "write_bytes_per_message": writes,
            "bytes_received_per_message": tally.received / count,
            "failed_commands": tally.failed,
        }
    table.notes.append(
        f"Counted with pymongo command monitoring over {count} messages per variant; "
        "bytes are len(bson.encode(command)) and len(bson.encode(reply))."
    )
    return table
