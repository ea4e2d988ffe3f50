"""Run the benchmark suite: ``python -m benchmarks [--quick] [--only NAME ...]``.

Each benchmark gets a fresh wire server (so one benchmark's oplog and heap do not weigh
on the next), or ``$MONGODB_URI`` when it is set. Results go to ``benchmarks/results.json``
and are printed as Markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pymongo

from benchmarks import (
    audit,
    batch,
    claim,
    codec,
    cosmos,
    cosmos_aio,
    cosmos_dispatch,
    dispatch,
    endpoint,
    immediate,
    kafka,
    kafka_consume,
    lag,
    memory,
    rabbitmq,
    spill,
    store,
    structure,
    tracing,
)
from benchmarks.common import Scale, Table, mongo_server

Bench = Callable[[str, Scale], Table]

#: name -> (function, Java heap for its wire server)
BENCHMARKS: dict[str, tuple[Bench, str | None]] = {
    "structure": (structure.run, None),
    "raw": (store.versus_raw, None),
    "outbox": (store.versus_classic, None),
    "inbox": (store.inbox_cost, None),
    "hot": (store.hot_aggregate, None),
    "dispatch": (dispatch.run, None),
    "memory": (memory.run, "10g"),
    "batch": (batch.batching, None),
    "group": (batch.group_commit, None),
    "immediate": (immediate.run, None),
    "tracing": (tracing.run, None),
    "codec": (codec.run, None),
    "claim": (claim.run, None),
    "spill": (spill.run, None),
    "audit": (audit.run, "6g"),
    "kafka": (kafka.run, None),
    "kafka-consume": (kafka_consume.run, None),
    "rabbitmq": (rabbitmq.run, None),
    "endpoint": (endpoint.run, None),
    "lag": (lag.run, "8g"),
}
#: Run only when named with --only; they need no MongoDB server (Cosmos DB: a local
#: Cosmos DB server, or COSMOS_ENDPOINT/COSMOS_KEY; audit-scale: Parquet snapshots it
#: writes under .scratch/).
OPTIONAL: dict[str, Bench] = {
    "cosmos_handle": cosmos.handle_bench,
    "cosmos_handle_aio": cosmos_aio.handle_bench,
    "cosmos_spill": spill.cosmos_bench,
    "cosmos_drain_aio": cosmos_aio.drain_bench,
    "cosmos_dispatch_drain": cosmos_dispatch.drain_bench,
    "cosmos_dispatch_drain_1": cosmos_dispatch.single_bench,
    "cosmos_dispatch_hot": cosmos_dispatch.hot_bench,
    "audit-scale": audit.run_scale,
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results.json"
#: Where a --quick run writes by default: its figures mean nothing, so it never replaces
#: the recorded ones.
QUICK_OUT = Path(__file__).resolve().parent / "results-quick.json"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pymongo": pymongo.version,
        "platform": platform.platform(),
    }
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        info["cpu"] = found.group(1).strip() if found else None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        found = re.search(r"MemTotal:\s+(\d+)", meminfo.read_text())
        info["memory_gib"] = round(int(found.group(1)) / 1024**2, 1) if found else None
    java = shutil.which("java")
    if java:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
        info["java"] = (out.stderr or out.stdout).splitlines()[0] if out.stderr else None
    info["server"] = (
        "MONGODB_URI" if os.environ.get("MONGODB_URI") else "mongo-java-server 1.47.0 (memory)"
    )
    return info


def merged(out: Path, results: dict[str, Any]) -> dict[str, Any]:
    """``results`` over what ``out`` already holds from runs of the same kind (quick or
    not): a run of some benchmarks replaces theirs and keeps the others'."""
    try:
        previous = json.loads(out.read_text())
    except (OSError, ValueError):
        return results
    if not isinstance(previous, dict) or previous.get("quick") != results["quick"]:
        return results
    combined = {**previous, **results}
    for key in ("seconds", "benchmarks"):
        kept = previous.get(key)
        combined[key] = {**(kept if isinstance(kept, dict) else {}), **results[key]}
    return combined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts: proves the code runs")
    parser.add_argument(
        "--only", nargs="+", choices=[*BENCHMARKS, *OPTIONAL], default=list(BENCHMARKS)
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results JSON file (default: {DEFAULT_OUT.name}, with --quick {QUICK_OUT.name})",
    )
    args = parser.parse_args(argv)
    out: Path = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    scale = Scale.quick() if args.quick else Scale()
    results: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "scale": scale.__dict__,
        "machine": machine(),
        "seconds": {},
        "benchmarks": {},
    }
    began = time.perf_counter()
    for name in args.only:
        bench, heap = BENCHMARKS[name] if name in BENCHMARKS else (OPTIONAL[name], None)
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        server = contextlib.nullcontext("") if name in OPTIONAL else mongo_server(java_heap=heap)
        with server as uri:
            table = bench(uri, scale)
        results["seconds"][name] = round(time.perf_counter() - start, 1)
        results["benchmarks"][name] = table.to_json()
        print(table.to_markdown() + "\n", flush=True)
    results["seconds"]["total"] = round(time.perf_counter() - began, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged(out, results), indent=2, default=str) + "\n")
    print(f"[bench] done in {results['seconds']['total']:.0f} s; wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
