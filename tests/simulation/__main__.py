"""Replay or explore simulated schedules.

    python -m tests.simulation --seed 42                   replay one schedule
    python -m tests.simulation --seed 42 --trace           ... and print every step
    python -m tests.simulation --seed 0 --count 1000       explore seeds 0..999
    python -m tests.simulation --seed 7 --store wire       on the MongoDB wire server
    python -m tests.simulation --seed 7 --store cosmos     on Cosmos DB
    python -m tests.simulation --seed 3 --mutation version-off --shrink

``--store wire`` uses ``--uri`` (or ``MONGODB_URI``), else starts a private
mongo-java-server. ``--store cosmos`` uses ``COSMOS_ENDPOINT``/``COSMOS_KEY``, else starts
the local Cosmos DB server. ``--shrink`` reduces a failing schedule (faults off, fewer
aggregates and commands) and prints the smallest replay command that still fails.
The exit status is 1 when any schedule fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from benchmarks.servers import (
    CosmosServer,
    MongoWireServer,
    cosmos_account_from_env,
    cosmos_server_available,
    mongo_wire_server_available,
)
from tests.simulation.harness import Report, run_schedule
from tests.simulation.mutations import MUTATIONS
from tests.simulation.schedule import CLAIM_FAULTS, FAULTS, STORES, Variant
from tests.simulation.shrink import shrink


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, default=1, help="run seeds seed..seed+count-1")
    parser.add_argument("--store", choices=STORES, default="memory")
    parser.add_argument("--uri", default=os.environ.get("MONGODB_URI"))
    parser.add_argument("--mutation", choices=sorted(MUTATIONS))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument(
        "--off", action="append", default=[], choices=sorted((*FAULTS, *CLAIM_FAULTS))
    )
    parser.add_argument("--trace", action="store_true", help="print every step")
    parser.add_argument("--shrink", action="store_true", help="minimize a failing schedule")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if any("=" not in item for item in args.set):
        sys.exit("--set takes FIELD=VALUE")
    settings = tuple((name, value) for name, _, value in (s.partition("=") for s in args.set))
    with ExitStack() as stack:
        client = None
        if args.store == "wire":
            client = open_client(args, stack)
        elif args.store == "cosmos":
            client = open_cosmos(stack)
        failures, totals, started = 0, Counter[str](), time.monotonic()
        for seed in range(args.seed, args.seed + args.count):
            variant = Variant(seed, args.store, args.mutation, settings, tuple(args.off))
            report = run_schedule(variant, client=client, trace=args.trace)
            totals.update(report.stats)
            if args.count == 1 or not report.ok:
                show(report, args.trace)
            if not report.ok:
                failures += 1
                if args.shrink:
                    smallest = shrink(report, lambda v: run_schedule(v, client=client))
                    print(f"smallest failing schedule: {smallest.command()}")
        elapsed = time.monotonic() - started
        print(f"{args.count} schedule(s), {failures} failing, {elapsed:.1f} s")
        if args.count > 1:
            print("totals: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items())))
    return 1 if failures else 0


def show(report: Report, trace: bool) -> None:
    if trace and report.trace is not None:
        print("\n".join(report.trace))
    print(report.schedule)
    print(
        f"steps: {report.steps}; " + ", ".join(f"{k}={v}" for k, v in sorted(report.stats.items()))
    )
    print("ok" if report.ok else report.describe(limit=50))


def open_client(args: argparse.Namespace, stack: ExitStack) -> Any:
    from pymongo import MongoClient

    uri = args.uri
    if uri is None:
        reason = mongo_wire_server_available()
        if reason:
            sys.exit(f"MongoDB wire server unavailable: {reason}")
        uri = stack.enter_context(MongoWireServer()).uri
    client: Any = MongoClient(uri, uuidRepresentation="standard")
    stack.callback(client.close)
    return client


def open_cosmos(stack: ExitStack) -> Any:
    """A scratch database on the Cosmos account (deleted on exit)."""
    from tests.support.cosmos import scratch_database

    account = cosmos_account_from_env()
    if account is None:
        reason = cosmos_server_available()
        if reason:
            sys.exit(f"Cosmos DB server unavailable: {reason}")
        account = stack.enter_context(CosmosServer()).account()
    return stack.enter_context(scratch_database(account))


if __name__ == "__main__":
    sys.exit(main())
