"""Benchmark 16: the cost of one scrape of the pending work per partition, as the
collection grows around a fixed backlog.

A collection holds ``aggregates`` documents, of which ``pending`` (spread over 16
partitions) hold 5 pending entries each; the others have an empty outbox. At each size,
three queries run in interleaved rounds:

- ``count_documents({"outbox.0": {"$exists": true}})`` (baseline): the server finding
  the pending documents, nothing more;
- ``pending_work`` (:func:`docoutbox_mongo.admin.pending_work`): the grouping
  aggregation a scrape runs, one row per partition back;
- ``outbox_stats`` (:func:`docoutbox_mongo.admin.outbox_stats`): the projection of every
  pending entry that ``outbox stats`` and the backlog gauges read, summarized in Python.

Before timing, ``pending_work``'s figures are checked against the fill (every partition's
entries, aggregates), so a fast wrong answer cannot pass, and each query's round trips
and reply bytes are counted once (structural: they follow the backlog, not the
collection). The collection has the store's
indexes (``ensure_indexes``, including the partial ``docoutbox_pending_partition``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

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
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.admin import PENDING, outbox_stats, pending_work

PARTITIONS = 16
ENTRIES_PER_PENDING = 5
VARIANTS = {
    "count": "count_documents of pending documents (baseline)",
    "work": "pending_work: one aggregation, a row per partition",
    "stats": "outbox_stats: every pending entry projected, summarized in Python",
}


def fill(coll: Any, aggregates: int, pending: int) -> None:
    """``aggregates`` documents; every ``aggregates // pending``-th holds entries, the
    pending ones spread evenly over the partitions."""
    now = datetime.now(UTC)
    every = max(1, aggregates // pending)
    batch: list[dict[str, Any]] = []
    for index in range(aggregates):
        aggregate_id = f"acc-{index:07d}"
        waiting = index % every == 0 and index // every < pending
        outbox = [
            {
                "id": f"{aggregate_id}-{seq}",
                "type": "Deposited",
                "payload": {"n": 1},
                "headers": {},
                "created_at": now,
                "seq": seq,
                "aggregate_id": aggregate_id,
                "aggregate_type": "Account",
            }
            for seq in range(1, ENTRIES_PER_PENDING + 1)
        ]
        batch.append(
            {
                "_id": aggregate_id,
                "type": "Account",
                "version": 1,
                "partition": (index // every if waiting else index) % PARTITIONS,
                "state": {"balance": 1},
                "inbox": [],
                "outbox": outbox if waiting else [],
                "outbox_seq": ENTRIES_PER_PENDING if waiting else 0,
                "updated_at": now,
            }
        )
        if len(batch) == 1000 or index == aggregates - 1:
            coll.insert_many(batch)
            batch = []


def _expected(aggregates: int, pending: int) -> dict[int, int]:
    every = max(1, aggregates // pending)
    per: dict[int, int] = {}
    for index in range(0, aggregates, every):
        if index // every < pending:
            partition = (index // every) % PARTITIONS
            per[partition] = per.get(partition, 0) + 1
    return per


def _check(coll: Any, aggregates: int, pending: int) -> None:
    work = pending_work(coll, PARTITIONS)
    expected = _expected(aggregates, pending)
    got = {p: b.aggregates for p, b in work.by_partition.items() if b.aggregates}
    entries = {p: b.entries for p, b in work.by_partition.items() if b.entries}
    if got != expected or entries != {p: n * ENTRIES_PER_PENDING for p, n in expected.items()}:
        raise AssertionError(f"pending work per partition is wrong: {got} != {expected}")


def _seconds(work: Any) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def _timed_queries(coll: Any) -> dict[str, Callable[[], float]]:
    """The seconds each pending-work query takes on ``coll``, one scrape per call."""
    return {
        "count": lambda: _seconds(lambda: coll.count_documents(PENDING)),
        "work": lambda: _seconds(lambda: pending_work(coll, PARTITIONS)),
        "stats": lambda: _seconds(lambda: outbox_stats(coll)),
    }


def _traffic(coll: Any, counter: CommandCounter) -> dict[str, tuple[int, int]]:
    """(round trips, bytes received) of one scrape by each query, on a counting client."""
    queries: dict[str, Callable[[], object]] = {
        "count": lambda: coll.count_documents(PENDING),
        "work": lambda: pending_work(coll, PARTITIONS),
        "stats": lambda: outbox_stats(coll),
    }
    traffic = {}
    for name, query in queries.items():
        with counter.counting() as tally:
            query()
        traffic[name] = (tally.round_trips, tally.received)
    return traffic


def run(uri: str, scale: Scale) -> Table:
    client = connect(uri)
    counter = CommandCounter()
    counted = connect(uri, counter)
    sizes = [max(scale.lag_pending, scale.lag_aggregates // 10), scale.lag_aggregates]
    # The wire server holds every document on its Java heap: 1,000,000 fit in 8 GB.
    samples: dict[int, dict[str, list[float]]] = {}
    fills: dict[int, float] = {}
    traffic: dict[int, dict[str, tuple[int, int]]] = {}
    try:
        for aggregates in sizes:
            coll = new_collection(client, "lag")
            began = time.perf_counter()
            fill(coll, aggregates, scale.lag_pending)
            MongoBackend(coll).ensure_indexes()
            fills[aggregates] = time.perf_counter() - began
            _check(coll, aggregates, scale.lag_pending)
            traffic[aggregates] = _traffic(counted[coll.database.name][coll.name], counter)
            samples[aggregates] = interleaved(
                _timed_queries(coll),
                rounds=max(3, scale.rounds // 3),
                warmup=scale.warmup,
            )
            coll.drop()
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
        counted.close()
    return _table(samples, fills, traffic, scale)


def _table(
    samples: dict[int, dict[str, list[float]]],
    fills: dict[int, float],
    traffic: dict[int, dict[str, tuple[int, int]]],
    scale: Scale,
) -> Table:
    small, large = sorted(samples)
    pending = scale.lag_pending
    table = Table(
        key="lag",
        title=(
            f"Cost of one pending-work scrape: {pending:,} pending aggregates "
            f"({pending * ENTRIES_PER_PENDING:,} entries) in {small:,} and {large:,} aggregates"
        ),
        columns=[
            "query",
            f"vs baseline ({small:,})",
            f"vs baseline ({large:,})",
            "large vs small collection",
            f"ms per scrape ({small:,}, info)",
            f"ms per scrape ({large:,}, info)",
            "round trips",
            f"KB received ({small:,} / {large:,})",
        ],
    )
    for name, label in VARIANTS.items():
        lo = samples[small][name]
        hi = samples[large][name]
        vs_small = paired_ratio(lo, samples[small]["count"])
        vs_large = paired_ratio(hi, samples[large]["count"])
        growth = median(hi) / median(lo)
        trips, received = traffic[large][name]
        kb = f"{traffic[small][name][1] / 1000:.1f} / {received / 1000:.1f}"
        table.add(
            label, vs_small, vs_large, growth, median(lo) * 1000, median(hi) * 1000, trips, kb
        )
        table.figures[name] = {
            "vs_baseline_small": vs_small,
            "vs_baseline_small_iqr": ratio_range(lo, samples[small]["count"]),
            "vs_baseline_large": vs_large,
            "vs_baseline_large_iqr": ratio_range(hi, samples[large]["count"]),
            "large_vs_small": growth,
            "seconds_small": median(lo),
            "seconds_large": median(hi),
            "round_trips_large": trips,
            "bytes_received_small": traffic[small][name][1],
            "bytes_received_large": received,
        }
    table.figures["fill_seconds"] = {str(k): v for k, v in fills.items()}
    table.notes.append(
        "Ratios are of seconds per scrape (lower is cheaper), paired by round; every "
        "pending_work answer was checked per partition before timing."
    )
    return table
