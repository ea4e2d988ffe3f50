"""Cosmos DB benchmarks: ``python -m benchmarks.cosmos [--quick] [--out FILE]``.

Against ``COSMOS_ENDPOINT``/``COSMOS_KEY`` when set, else a private local Cosmos DB server.
Every figure is a ratio against a baseline measured in the same rounds, on the same
account (see ``benchmarks/common.py``):

1. **handle throughput** of docoutbox vs a raw azure-cosmos loop making the same write
   (read, then one patch guarded by ``version``; cached: the patch alone), with round
   trips and request units (RU) per handled message, counted from every HTTP response;
2. **commit strategy**: the raw cached loop with a version-guarded patch vs an
   ETag-guarded replace of the whole item (why docoutbox commits with a patch);
3. **dispatch drain**: the dispatcher (change feed per feed range, counting publisher,
   trims) vs a raw read of the same change feed, in entries per second;
4. **memory** of a dispatcher draining a backlog, at three backlog sizes (it must stay
   flat), each in its own process;
5. ``handle-aio`` and ``drain-aio``: 1 and 3 on ``azure.cosmos.aio``
   (:mod:`benchmarks.cosmos_aio`).

A run of some benchmarks (``--only``) replaces their entries in the results file and
keeps the others'.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import exceptions as cosmos_errors

from benchmarks import cosmos_aio
from benchmarks.common import Scale, Table, median, paired_ratio, ratio_range
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
from benchmarks.servers import (
    CosmosAccount,
    cosmos_account_from_env,
)
from benchmarks.workload import Account, Doc, Feed, handlers
from docoutbox import AggregateStore, InboxPolicy, StoreConfig
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.testing.dispatch import MemoryCheckpoints
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.changes import CosmosChangeSource

DEFAULT_OUT = Path(__file__).resolve().parent / "results_cosmos.json"
#: What ``--only`` selects; ``-aio`` are the ``azure.cosmos.aio`` twins (benchmarks.cosmos_aio).
NAMES = ["handle", "drain", "memory", "handle-aio", "drain-aio"]
#: The scale of a full run.
SCALE = replace(Scale(), messages=150, rounds=21)


class RawLoop:
    """The docoutbox commit written by hand with azure-cosmos, on the same item layout.

    ``strategy`` "patch": ``patch_item`` guarded by ``FROM c WHERE c.version = v``;
    "replace": ``replace_item`` of the whole item guarded by its ETag. ``cached`` keeps
    the item each write returns, so a commit is one request (like docoutbox's cache).
    """

    def __init__(
        self, container: Any, meter: Meter, *, window: int, cached: bool, strategy: str
    ) -> None:
        self.container = container
        self.meter = meter
        self.window = window
        self.cached = cached
        self.strategy = strategy
        self._items: dict[str, Doc] = {}

    def handle(self, account: str, message: Doc) -> None:
        item = self._items.pop(account, None)
        hook = {"raw_response_hook": self.meter.hook}
        while True:
            if item is None:
                item = self.container.read_item(account, partition_key=account, **hook)
            if message["id"] in item["inbox"]:
                return
            new, inbox, now = deposit(item, message, self.window)
            try:
                if self.strategy == "patch":
                    written = self.container.patch_item(
                        account,
                        partition_key=account,
                        **guarded_patch(item, new, inbox, now),
                        **hook,
                    )
                else:
                    body = {
                        k: v for k, v in item.items() if k not in ("_rid", "_self", "_ts", "_lsn")
                    }
                    body.update(state=new, version=item["version"] + 1, inbox=inbox)
                    body["updated_at"] = now
                    written = self.container.replace_item(
                        account, body, etag=item["_etag"], match_condition=_IF_NOT_MODIFIED, **hook
                    )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if exc.status_code != 412:
                    raise
                item = None
                continue
            if self.cached:
                self._items[account] = written
            return


def _if_not_modified() -> Any:

    return MatchConditions.IfNotModified


_IF_NOT_MODIFIED = _if_not_modified()


@dataclass
class Contestant:
    handle: Any
    feed: Feed
    meter: Meter
    messages: int
    trips: list[float] = field(default_factory=list)
    charges: list[float] = field(default_factory=list)
    #: Per round: messages per second of wall time, and client CPU seconds per message.
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    #: Per round: the wall time of each chunk, in turn order.
    chunks: list[list[float]] = field(default_factory=list)


def _paired_rounds(contestants: dict[str, Contestant], rounds: int, warmup: int) -> None:
    """Rounds in which every contestant handles its messages in chunks of
    :data:`HANDLE_CHUNK`, the contestants taking turns chunk by chunk (order rotated each
    time), so a slow second of the shared machine hits them all alike. Each round records
    each contestant's rate (wall time) and client CPU per message (``process_time``: the
    server is another process), after ``warmup`` unrecorded rounds."""
    names = list(contestants)
    turn = 0
    for index in range(warmup + rounds):
        batches = {name: c.feed.take(c.messages) for name, c in contestants.items()}
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpu = dict.fromkeys(names, 0.0)
        before = {name: c.meter.snapshot() for name, c in contestants.items()}
        gc.collect()
        for start in range(0, max(len(b) for b in batches.values()), HANDLE_CHUNK):
            shift = turn % len(names)
            turn += 1
            for name in names[shift:] + names[:shift]:
                handle = contestants[name].handle
                chunk = batches[name][start : start + HANDLE_CHUNK]
                began, began_cpu = time.perf_counter(), time.process_time()
                for account, message in chunk:
                    handle(account, message)
                cpu[name] += time.process_time() - began_cpu
                walls[name].append(time.perf_counter() - began)
        if index < warmup:
            continue
        for name, c in contestants.items():
            count = len(batches[name])
            responses, charge = before[name]
            after, charged = c.meter.snapshot()
            c.trips.append((after - responses) / count)
            c.charges.append((charged - charge) / count)
            c.rates.append(count / sum(walls[name]))
            c.cpu.append(cpu[name] / count)
            c.chunks.append(walls[name])


def _chunk_ratios(candidate: Contestant, baseline: Contestant) -> list[float]:
    """Per round, the median over its chunks of baseline time / candidate time for the
    same chunk: a stall of the shared machine spoils one chunk's pair, not the round."""
    return [
        median([b / c for b, c in zip(base, cand, strict=True)])
        for base, cand in zip(baseline.chunks, candidate.chunks, strict=True)
    ]


def _ratio_cell(ratios: list[float]) -> tuple[str, float, list[float]]:
    """``median (IQR)`` of per-round ratios, the median, and the IQR."""
    low, high = ratio_range(ratios, [1.0] * len(ratios))
    mid = median(ratios)
    return f"{mid:.2f}x ({low:.2f}-{high:.2f})", mid, [low, high]


#: Messages a contestant handles before the next one takes its turn (half the aggregates).
HANDLE_CHUNK = 10
#: Each variant's like-for-like raw loop: same round trips, same request charge.
HANDLE_BASELINES = {
    "raw read + patch": "raw read + patch",
    "raw cached patch": "raw cached patch",
    "raw cached replace (ETag)": "raw cached patch",
    "docoutbox cold (cache off)": "raw read + patch",
    "docoutbox warm (cached)": "raw cached patch",
}


def handle_throughput(database: Any, scale: Scale) -> Table:
    """Benchmarks 1 and 2: docoutbox vs raw azure-cosmos loops; patch vs replace."""
    window = InboxPolicy().window
    load_before = os.getloadavg()
    contestants: dict[str, Contestant] = {}
    raw = (
        ("raw read + patch", False, "patch"),
        ("raw cached patch", True, "patch"),
        ("raw cached replace (ETag)", True, "replace"),
    )
    for name, cached, strategy in raw:
        container, accounts = make_accounts(database, "raw", scale)
        meter = Meter()
        loop = RawLoop(container, meter, window=window, cached=cached, strategy=strategy)
        contestants[name] = Contestant(
            loop.handle, Feed(accounts, emit=False), meter, scale.messages
        )
    for name, cache in (("docoutbox cold (cache off)", 0), ("docoutbox warm (cached)", 1024)):
        container, accounts = make_accounts(database, "dox", scale)
        meter = Meter()
        backend = CosmosBackend(container, on_charge=meter.on_charge)
        store = AggregateStore(backend, Account, StoreConfig(cache_size=cache))

        def handle(account: str, message: Doc, store: AggregateStore[Account] = store) -> None:
            if not store.handle(account, message, handlers).applied:
                raise AssertionError(f"{account}: message {message['id']} not applied")

        contestants[name] = Contestant(handle, Feed(accounts, emit=False), meter, scale.messages)
    _paired_rounds(contestants, scale.rounds, scale.warmup)
    samples = {name: c.rates for name, c in contestants.items()}
    # CPU as a throughput ratio: baseline CPU / candidate CPU, comparable with the speed.
    speed = {name: [1 / x for x in c.cpu] for name, c in contestants.items()}
    table = Table(
        "cosmos_handle",
        f"Cosmos DB: docoutbox vs a raw azure-cosmos loop doing the same write (window {window})",
        [
            "variant",
            "round trips / msg",
            "RU / msg",
            "msgs/s",
            "vs raw read + patch",
            "vs raw cached patch",
            "client CPU ms / msg",
            "CPU vs like-for-like raw",
        ],
    )
    for name, c in contestants.items():
        trips, charge = median(c.trips), median(c.charges)
        base = HANDLE_BASELINES[name]
        cpu_low, cpu_high = ratio_range(speed[name], speed[base])
        cold_cell, cold, cold_iqr = _ratio_cell(_chunk_ratios(c, contestants["raw read + patch"]))
        warm_cell, warm, warm_iqr = _ratio_cell(_chunk_ratios(c, contestants["raw cached patch"]))
        table.add(
            name,
            trips,
            charge,
            median(samples[name]),
            cold_cell,
            warm_cell,
            1000 * median(c.cpu),
            paired_cell(speed, name, base),
        )
        table.figures[name] = {
            "per_s": median(samples[name]),
            "round_trips_per_message": trips,
            "request_units_per_message": charge,
            "vs_raw": cold,
            "vs_raw_iqr": cold_iqr,
            "vs_raw_cached": warm,
            "vs_raw_cached_iqr": warm_iqr,
            "vs_raw_by_round_totals": paired_ratio(samples[name], samples["raw read + patch"]),
            "vs_raw_cached_by_round_totals": paired_ratio(
                samples[name], samples["raw cached patch"]
            ),
            "client_cpu_ms_per_message": 1000 * median(c.cpu),
            "cpu_baseline": base,
            "cpu_vs_baseline": paired_ratio(speed[name], speed[base]),
            "cpu_vs_baseline_iqr": [cpu_low, cpu_high],
        }
    table.figures["run"] = {
        "rounds": scale.rounds,
        "messages_per_round": scale.messages,
        "chunk": HANDLE_CHUNK,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
    }
    table.notes.append(
        "Like for like: cold vs raw read + patch (2 round trips each), warm vs raw cached "
        "patch (1 each). Target: docoutbox >= 0.85x its raw counterpart."
    )
    table.notes.append(
        f"Contestants take turns every {HANDLE_CHUNK} messages within each of the "
        f"{scale.rounds} rounds. Speed ratios: per round, the median over its chunks of "
        "baseline time / variant time for the same chunk; then the median over rounds "
        "(IQR of the rounds in brackets). msgs/s: median of per-round rates."
    )
    table.notes.append(
        "Client CPU is the benchmark process's process_time per message (the server is "
        "another process); 'CPU vs like-for-like raw' is raw CPU / this variant's CPU, a "
        "throughput ratio when the client is the bottleneck, and far less sensitive to "
        "the machine's load than wall time."
    )
    table.notes.append(
        "Commit strategy: 'raw cached replace (ETag)' vs 'raw cached patch' is the cost of "
        "replacing the whole item instead of patching it. docoutbox patches (guarded by "
        "version) also because a trim changes the ETag, never the version: an ETag replace "
        "would make every trim fail the next commit (invariant I3)."
    )
    return table


def handle_bench(_uri: str, scale: Scale) -> Table:
    """The handle benchmark alone, on its own account (``scripts/bench --only cosmos_handle``);
    ``_uri`` (a MongoDB server) is not used."""
    scale = handle_scale(scale)
    with cosmos_account() as account, account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            return handle_throughput(database, scale)
        finally:
            client.delete_database(database.id)


def raw_feed_read(container: Any, marker: Any, meter: Meter | None = None) -> int:
    """Entries in every item of the change feed after ``marker``, read page by page."""
    source = CosmosChangeSource(container if meter is None else FeedCounter(container, meter))
    source.open(marker)
    entries = 0
    while events := source.poll(1000):
        entries += sum(len((e.document or {}).get("outbox") or ()) for e in events)
    return entries


def dispatcher_drain(
    container: Any, marker: Any, expected: int, meter: Meter | None = None
) -> None:
    publisher = CountingPublisher()
    checkpoints = MemoryCheckpoints()
    checkpoints.save("bench", marker)
    feed = container if meter is None else FeedCounter(container, meter)
    dispatcher = Dispatcher(
        CosmosBackend(container, on_charge=None if meter is None else meter.on_charge),
        publisher,
        MemoryDeadLetters(),
        source=CosmosChangeSource(feed),
        checkpoints=checkpoints,
        config=DispatcherConfig(
            name="bench", concurrency=8, sweep_interval=3600, poll_interval=0.005
        ),
    )
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    while publisher.count < expected:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError(f"dispatcher published {publisher.count} of {expected}")
        time.sleep(0.002)
    dispatcher.stop()  # finishes in-flight work: every trim is done when it returns
    thread.join(60)
    if publisher.count != expected:
        raise AssertionError(f"published {publisher.count}, expected {expected}")


def drain(database: Any, scale: Scale) -> Table:
    """Benchmark 3: the dispatcher vs a raw change-feed read of the same backlog."""
    per_doc = 10
    docs = max(2, scale.dispatch_entries // per_doc)
    raw_rates, dispatch_rates = [], []
    raw_trips, dispatch_trips = [], []
    for _ in range(scale.warmup + max(1, scale.rounds // 2)):
        container = new_container(database, "drain")
        marker = CosmosChangeSource(container).start_marker()
        fill(container, docs, per_doc)
        raw_meter, dispatch_meter = Meter(), Meter()
        # The raw read first: the dispatcher's trims leave the feed's items empty.
        start = time.perf_counter()
        entries = raw_feed_read(container, marker, raw_meter)
        raw_rate = entries / (time.perf_counter() - start)
        if entries != docs * per_doc:
            raise AssertionError(f"raw read saw {entries} of {docs * per_doc} entries")
        start = time.perf_counter()
        dispatcher_drain(container, marker, entries, dispatch_meter)
        dispatch_rate = entries / (time.perf_counter() - start)
        raw_trips.append(raw_meter.snapshot()[0])
        dispatch_trips.append(dispatch_meter.snapshot()[0])
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
        database.delete_container(container.id)
    table = drain_table(
        "cosmos_drain",
        f"Cosmos DB: dispatcher drain vs a raw change-feed read ({docs} aggregates x {per_doc})",
        ("raw change-feed read", "dispatcher: publish + trim"),
        docs * per_doc,
        (raw_rates[scale.warmup :], raw_trips[scale.warmup :]),
        (dispatch_rates[scale.warmup :], dispatch_trips[scale.warmup :]),
    )
    table.notes.append(
        "The raw read only pages through the feed; the dispatcher reads the same feed, "
        "publishes from the feed's copy of each item (counting publisher) and trims it with "
        "one patch guarded by the copy's ETag. Requests are counted from every response, "
        "304s of an empty feed included. Target: >= 0.7x."
    )
    return table


def _rss_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def child(endpoint: str, database: str, container: str, expected: int) -> None:
    """Drain the container with a dispatcher; print the peak RSS growth (KiB) as JSON."""
    account = cosmos_account_from_env() or CosmosAccount(
        endpoint, os.environ["COSMOS_KEY"], {"enable_endpoint_discovery": False}, True
    )
    with account.client() as client:
        coll = client.get_database_client(database).get_container_client(container)
        marker = json.loads(os.environ["DOCOUTBOX_BENCH_MARKER"])
        CosmosChangeSource(coll).open(marker)  # warm the imports and the connection
        Path("/proc/self/clear_refs").write_text("5")
        base = _rss_kib("VmRSS")
        dispatcher_drain(coll, marker, expected)
        print(json.dumps({"growth_kib": _rss_kib("VmHWM") - base, "base_kib": base}))


def memory(database: Any, account: CosmosAccount, scale: Scale) -> Table:
    """Benchmark 4: peak memory of a dispatcher draining backlogs of two sizes."""
    per_doc = 10
    sizes = [max(2, scale.mem_docs // 200), max(3, scale.mem_docs // 50)]
    sizes.append(max(4, scale.mem_docs // 16))
    table = Table(
        "cosmos_memory",
        "Cosmos DB: dispatcher memory over a backlog (peak RSS growth while draining)",
        ["backlog (entries)", "peak RSS growth (MiB)"],
    )
    for docs in sizes:
        container = new_container(database, "mem")
        marker = CosmosChangeSource(container).start_marker()
        fill(container, docs, per_doc)
        env = {
            **os.environ,
            "COSMOS_KEY": account.key,
            "DOCOUTBOX_BENCH_MARKER": json.dumps(marker),
        }
        command = [
            sys.executable,
            *("-m", "benchmarks.cosmos", "--child"),
            *(account.endpoint, database.id, container.id, str(docs * per_doc)),
        ]
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        growth = json.loads(out.stdout.strip().splitlines()[-1])["growth_kib"] / 1024
        table.add(docs * per_doc, growth)
        table.figures[str(docs * per_doc)] = {"peak_rss_growth_mib": growth}
        database.delete_container(container.id)
    table.notes.append(
        "Each drain runs in its own process; flat means the growth does not scale with the "
        "backlog: a poll reads at most batch_size items, and the stream is not polled while "
        "max_backlog aggregates are in hand (each with the feed's copy of its document)."
    )
    return table


def run(account: CosmosAccount, scale: Scale, only: list[str] | None = None) -> list[Table]:
    tables = []
    with account.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            if only is None or "handle" in only:
                tables.append(handle_throughput(database, handle_scale(scale)))
            if only is None or "drain" in only:
                tables.append(drain(database, scale))
            if only is None or "memory" in only:
                tables.append(memory(database, account, scale))
            if only is None or "handle-aio" in only:
                tables.append(cosmos_aio.handle_throughput(database, account, scale))
            if only is None or "drain-aio" in only:
                tables.append(cosmos_aio.drain(database, account, scale))
        finally:
            client.delete_database(database.id)
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cosmos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts: proves the code runs")
    parser.add_argument("--only", nargs="+", choices=NAMES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", nargs=4, metavar=("ENDPOINT", "DB", "CONTAINER", "COUNT"))
    args = parser.parse_args(argv)
    if args.child:
        endpoint, db, container, count = args.child
        child(endpoint, db, container, int(count))
        return 0
    scale = Scale.quick() if args.quick else SCALE
    began, load = time.perf_counter(), os.getloadavg()[0]
    with cosmos_account() as account:
        tables = run(account, scale, args.only)
    for table in tables:
        print(table.to_markdown() + "\n", flush=True)
    record(tables, args.out, quick=args.quick, scale=scale, began=began, load=load)
    return 0


def record(
    tables: list[Table], out: Path, *, quick: bool, scale: Scale, began: float, load: float
) -> None:
    """Write ``tables`` into ``out``, keeping the other benchmarks it holds from runs of the
    same kind (quick or not), each with when it ran and the machine's load then."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    loads = f"{load:.1f} at start, {os.getloadavg()[0]:.1f} at end (1-minute)"
    try:
        previous = json.loads(out.read_text())
    except (OSError, ValueError):
        previous = {}
    if not isinstance(previous, dict) or previous.get("quick") != quick:
        previous = {}
    results = {
        **previous,
        "generated_at": now,
        "quick": quick,
        "scale": scale.__dict__,
        "seconds": round(time.perf_counter() - began, 1),
        "benchmarks": {**previous.get("benchmarks", {}), **{t.key: t.to_json() for t in tables}},
        "runs": {
            **previous.get("runs", {}),
            **{t.key: {"generated_at": now, "load_average": loads} for t in tables},
        },
    }
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
