"""Benchmark: the cost per message of a spilling inbox, as ratios against the plain window.

Two stores on the wire server differ only in their inbox policy, each over its own
collection of aggregates:

- ``window``: ``InboxPolicy(window=100)``, the default path (IDs past the window are
  forgotten); the baseline, its aggregates never spilled;
- ``spill, spilled``: ``InboxPolicy(window=100, spill=True)`` on aggregates that have
  spilled (300 IDs handled before the first round): each new message is looked up in the
  archive (one ``find``), and every 50 new messages of an aggregate write 50 IDs to the
  archive (one bulk write) in the commit that spills.

An aggregate with ``spill=True`` that never spilled does exactly the I/O of the baseline
(no read, no write of the archive: ``tests/unit/test_inbox_spill.py``), so it has no row.

``redelivery`` rows handle again a message the aggregate processed long ago, through
stores without a document cache (a duplicate found in a cached window costs no round
trip at all): on the spilled aggregates it is found in the archive (a load and a read);
the baseline's redelivery is one still in its window (a load; one older would be handled
again).
Handlers emit nothing, so no outbox grows. Rounds are interleaved and paired.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    ratio_range,
)
from benchmarks.cosmos_common import cosmos_account, handle_scale, new_container
from docoutbox import Aggregate, AggregateStore, Decision, InboxPolicy, Message, StoreConfig
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.archive import ensure_archive
from docoutbox_mongo import MongoBackend

WINDOW = 100
PREFILL = 3 * WINDOW


class Tally(Aggregate):
    n: int = 0


def count(state: Tally, message: Message) -> Decision[Tally]:
    return Decision(Tally(n=state.n + 1))


def _new_messages(
    store: AggregateStore[Tally], ids: list[str], messages: int, prefix: str
) -> Callable[[], float]:
    serial = itertools.count()

    def round_() -> float:
        start = time.perf_counter()
        for n in range(messages):
            store.handle(ids[n % len(ids)], {"id": f"{prefix}-{next(serial)}", "type": "T"}, count)
        return messages / (time.perf_counter() - start)

    return round_


def _redeliveries(
    store: AggregateStore[Tally], ids: list[str], messages: int, old: Callable[[int], str]
) -> Callable[[], float]:
    def round_() -> float:
        start = time.perf_counter()
        for n in range(messages):
            outcome = store.handle(ids[n % len(ids)], {"id": old(n), "type": "T"}, count)
            assert outcome.duplicate
        return messages / (time.perf_counter() - start)

    return round_


def _figures(samples: dict[str, list[float]], base: str) -> dict[str, Any]:
    return {
        name: {
            "ratio": paired_ratio(values, samples[base]),
            "iqr": ratio_range(values, samples[base]),
            "rate": median(values),
        }
        for name, values in samples.items()
    }


#: A store of one variant over its collection, given a document cache size.
Factory = Callable[[InboxPolicy, int], AggregateStore[Tally]]


def compare(table: Table, make: dict[str, Factory], scale: Scale, ids: list[str]) -> None:
    """Fill both variants (``plain`` and ``on``), then measure redeliveries and new
    messages into ``table``."""
    policies = {
        "plain": InboxPolicy(window=WINDOW),
        "on": InboxPolicy(window=WINDOW, spill=True),
    }
    stores = {name: make[name](policies[name], 1024) for name in policies}
    for name, store in stores.items():
        prefill = PREFILL if name == "on" else WINDOW // 2
        for aggregate in ids:
            for n in range(prefill):
                store.handle(aggregate, {"id": f"old-{n}", "type": "T"}, count, create=True)

    # Redeliveries first, while the baseline's old IDs are still in its window.
    # Uncached stores: a duplicate found in a cached window costs no round trip at all.
    uncached = {name: make[name](policies[name], 0) for name in policies}
    redelivered = {
        "window": _redeliveries(
            uncached["plain"], ids, scale.messages, lambda n: f"old-{n % (WINDOW // 2)}"
        ),
        "spill, spilled": _redeliveries(
            uncached["on"], ids, scale.messages, lambda n: f"old-{n % WINDOW}"
        ),
    }
    again = _figures(interleaved(redelivered, scale.rounds, scale.warmup), "window")
    _rows(table, "redelivery", again)
    table.figures["redelivery"] = again
    rounds = {
        "window": _new_messages(stores["plain"], ids, scale.messages, "w"),
        "spill, spilled": _new_messages(stores["on"], ids, scale.messages, "s"),
    }
    handle = _figures(interleaved(rounds, scale.rounds, scale.warmup), "window")
    _rows(table, "new message", handle)
    table.figures["new_message"] = handle
    table.figures["load_average"] = os.getloadavg()
    table.notes.append(
        f"{len(ids)} aggregates, {scale.messages} messages per round, window "
        f"{WINDOW}; a spill moves the oldest {WINDOW // 2} IDs. Load average at the end: "
        + " / ".join(f"{x:.1f}" for x in os.getloadavg())
    )


def _rows(table: Table, what: str, figures: dict[str, Any]) -> None:
    for name, figure in figures.items():
        iqr = "{:.2f}-{:.2f}".format(*figure["iqr"])
        table.add(what, name, figure["rate"], figure["ratio"], iqr)


def run(uri: str, scale: Scale) -> Table:
    """On the wire server: ``<collection>.inbox`` is the archive."""
    table = Table(
        "spill",
        "Inbox spill-over vs the plain window of 100 (ratio of throughputs; wire server)",
        ["what", "store", "ops/s", "vs window", "IQR"],
    )
    ids = [f"a-{i}" for i in range(scale.aggregates)]
    client = connect(uri)
    colls = {name: new_collection(client, f"spill_{name}") for name in ("plain", "on")}

    def factory(name: str) -> Factory:
        def make(policy: InboxPolicy, cache: int) -> AggregateStore[Tally]:
            config = StoreConfig(inbox=policy, cache_size=cache)
            return AggregateStore(MongoBackend(colls[name]), Tally, config)

        return make

    try:
        compare(table, {name: factory(name) for name in colls}, scale, ids)
        return table
    finally:
        for coll in colls.values():
            coll.database.drop_collection(f"{coll.name}.inbox")
            coll.drop()
        client.close()


def cosmos_bench(_uri: str, scale: Scale) -> Table:
    """On Cosmos DB (``scripts/bench --only cosmos_spill``): a side container partitioned
    on ``/pk`` is the archive; ``_uri`` (a MongoDB server) is not used."""
    scale = handle_scale(scale)
    table = Table(
        "cosmos_spill",
        "Cosmos DB: inbox spill-over vs the plain window of 100 (ratio of throughputs)",
        ["what", "store", "ops/s", "vs window", "IQR"],
    )
    ids = [f"a-{i}" for i in range(scale.aggregates)]
    with cosmos_account() as account, account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            containers = {
                name: new_container(database, f"spill_{name}") for name in ("plain", "on")
            }
            archive = ensure_archive(database, f"{containers['on'].id}.inbox")

            def factory(name: str) -> Factory:
                def make(policy: InboxPolicy, cache: int) -> AggregateStore[Tally]:
                    backend = CosmosBackend(
                        containers[name], inbox_archive=archive if name == "on" else None
                    )
                    config = StoreConfig(inbox=policy, cache_size=cache)
                    return AggregateStore(backend, Tally, config)

                return make

            compare(table, {name: factory(name) for name in containers}, scale, ids)
            return table
        finally:
            client.delete_database(database.id)
