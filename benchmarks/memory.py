"""Benchmark 6: memory of walking a large backlog of pending entries (it must stream).

A collection is filled with ``docs x entries_per_doc`` pending entries. Each reader runs in
its own Python process, which reports its peak RSS growth: ``VmHWM`` (reset through
``/proc/self/clear_refs`` once connected) minus the RSS at that point. Readers:

- raw cursor (baseline): iterate ``find({"outbox.0": {"$exists": true}})``;
- ``AggregateStore.pending()``: the store's paged iterator, parsing every entry;
- dispatcher sweep: a :class:`~docoutbox.Dispatcher` without a change stream
  publishes and trims everything (runs last: it empties the backlog);
- load everything: ``list(find(...))``, the reference for what not streaming costs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import Scale, Table, connect, new_collection
from benchmarks.workload import Account
from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_mongo import MongoBackend

PAGE = 1000  # pending() batch size and sweep page
REPO = Path(__file__).resolve().parents[1]
MODES = {
    "raw": "raw cursor (baseline)",
    "pending": "AggregateStore.pending()",
    "everything": "list(find()) (reference)",
    "sweep": "Dispatcher sweep, counting publisher",
}


def fill(coll: Any, docs: int, per_doc: int) -> None:
    """Insert ``docs`` aggregates with ``per_doc`` pending entries each, in batches."""
    now = datetime.now(UTC)
    batch: list[dict[str, Any]] = []
    for index in range(docs):
        aggregate_id = f"acc-{index:07d}"
        outbox = [
            {
                "id": str(uuid.uuid4()),
                "type": "Deposited",
                "payload": {"n": 1, "balance": seq},
                "headers": {},
                "created_at": now,
                "seq": seq,
                "aggregate_id": aggregate_id,
                "aggregate_type": "Account",
                "correlation_id": "m",
                "causation_id": "m",
                "destination": None,
            }
            for seq in range(1, per_doc + 1)
        ]
        batch.append(
            {
                "_id": aggregate_id,
                "type": "Account",
                "version": per_doc,
                "partition": index % 16,
                "state": {"balance": per_doc, "deposits": per_doc},
                "inbox": [],
                "inbox_marks": [],
                "outbox": outbox,
                "outbox_seq": per_doc,
                "created_at": now,
                "updated_at": now,
            }
        )
        if len(batch) == 1000 or index == docs - 1:
            coll.insert_many(batch)
            batch = []


def run(uri: str, scale: Scale) -> Table:
    """Every reader over a backlog of a tenth of the size, then of the full size.

    Peak growth that does not follow the backlog's size is what streaming means.
    """
    client = connect(uri)
    sizes = [max(1, scale.mem_docs // 10), scale.mem_docs]
    samples: dict[int, dict[str, dict[str, Any]]] = {}
    fill_seconds = 0.0
    try:
        for docs in sizes:
            coll = new_collection(client, "memory")
            began = time.perf_counter()
            fill(coll, docs, scale.mem_entries_per_doc)
            fill_seconds = time.perf_counter() - began
            where = [uri, coll.database.name, coll.name, str(docs * scale.mem_entries_per_doc)]
            samples[docs] = {mode: _child(mode, where) for mode in MODES}
            left = coll.count_documents({"outbox.0": {"$exists": True}})
            if left:
                raise AssertionError(f"the sweep left {left} documents with pending entries")
            coll.drop()
    finally:
        client.drop_database("docoutbox_bench")
        client.close()
    return _table(samples, scale, fill_seconds)


def _child(mode: str, where: list[str]) -> dict[str, Any]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", mode, *where],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory reader {mode!r} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["entries"] != int(where[-1]):
        raise AssertionError(f"{mode}: saw {result['entries']} entries, expected {where[-1]}")
    return result


def _table(samples: dict[int, dict[str, dict[str, Any]]], scale: Scale, fill: float) -> Table:
    small, large = sorted(samples)
    per = scale.mem_entries_per_doc
    table = Table(
        "memory",
        f"Peak RSS growth walking a backlog of pending entries ({per} per aggregate)",
        [
            "reader",
            f"growth MB, {small * per:,} entries",
            f"growth MB, {large * per:,} entries",
            "large vs small backlog",
            "vs raw cursor (large)",
            "seconds (large, info)",
        ],
    )
    base = max(1, samples[large]["raw"]["growth_kb"])
    for mode, label in MODES.items():
        low, high = samples[small][mode], samples[large][mode]
        table.add(
            label,
            low["growth_kb"] / 1024,
            high["growth_kb"] / 1024,
            f"{high['growth_kb'] / max(1, low['growth_kb']):.2f}x",
            f"{high['growth_kb'] / base:.2f}x",
            high["seconds"],
        )
        table.figures[mode] = {
            "growth_mb_small": low["growth_kb"] / 1024,
            "growth_mb_large": high["growth_kb"] / 1024,
            "vs_raw": high["growth_kb"] / base,
            "seconds_large": high["seconds"],
        }
    table.notes += [
        "Each reader runs once per backlog in a fresh process; growth = VmHWM - VmRSS "
        "after connecting (VmHWM reset through /proc/self/clear_refs). Memory figures "
        "vary by about 1 MB between runs, so one run each is enough.",
        f"pending() and the sweep page {PAGE} documents at a time. The wire server does not "
        "use the _id index for sorted range queries, so every page scans the collection: "
        "that, not docoutbox, is why pending() takes longer than one raw cursor.",
        "The sweep's publisher only counts (MemoryPublisher keeps every entry it accepts, "
        "which would measure the test double, not the dispatcher). Checked: it published "
        "every entry and left no pending document.",
        f"Filling the large backlog took {fill:.0f} s (insert_many, 1,000 documents per batch).",
    ]
    return table


# -- the reader process -------------------------------------------------------------------


def _status(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"{key}:\s+(\d+)", text)
    assert match is not None
    return int(match.group(1))


class CountingPublisher:
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def publish(self, entry: Any) -> None:
        with self._lock:
            self.count += 1


def _read(mode: str, coll: Any, total: int) -> int:
    query = {"outbox.0": {"$exists": True}}
    if mode == "raw":
        return sum(len(doc["outbox"]) for doc in coll.find(query, batch_size=PAGE))
    if mode == "everything":
        docs = list(coll.find(query, batch_size=PAGE))
        return sum(len(doc["outbox"]) for doc in docs)
    if mode == "pending":
        store = AggregateStore(MongoBackend(coll), Account)
        return sum(len(snap.outbox) for snap in store.pending(batch_size=PAGE))
    publisher = CountingPublisher()
    config = DispatcherConfig(name="memory", sweep_page=PAGE)
    dispatcher = Dispatcher(MongoBackend(coll), publisher, MemoryDeadLetters(), config=config)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 3600
    while publisher.count < total and time.monotonic() < deadline:
        time.sleep(0.05)
    dispatcher.stop()
    thread.join()
    return publisher.count


def child(mode: str, uri: str, db: str, name: str, total: int) -> None:
    client = connect(uri)
    coll = client[db][name]
    coll.find_one({})
    Path("/proc/self/clear_refs").write_text("5")
    start = _status("VmRSS")
    began = time.perf_counter()
    entries = _read(mode, coll, total)
    seconds = time.perf_counter() - began
    growth = _status("VmHWM") - start
    client.close()
    print(json.dumps({"entries": entries, "growth_kb": growth, "seconds": seconds}))


if __name__ == "__main__":
    _mode, _uri, _db, _name, _total = sys.argv[1:6]
    child(_mode, _uri, _db, _name, int(_total))
