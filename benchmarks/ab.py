"""Paired A/B of the warm handle: the raw cached loop, another commit's store and this one.

Usage: ``.venv/bin/python -m benchmarks.ab REV [--rounds N] [--messages N]``

``REV``'s ``docoutbox`` and ``docoutbox_mongo`` are exported with ``git archive`` into a
temporary folder under other package names (imports rewritten), so both stores run in one
process, on one wire server, in interleaved rounds (the order rotates every round). Each
variant has its own 20 accounts (inbox window 100, no emitted messages, cache on), as in
``--only raw``. Printed: messages/s and client CPU per message (process time) per
variant, and the paired ratios per round (median and interquartile range).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.common import connect, mongo_server, new_collection
from benchmarks.workload import Feed, RawLoop, account_ids, create_accounts

REPO = Path(__file__).resolve().parents[1]
BASE = "dxbase"
Handle = Callable[[str, dict[str, Any]], None]


def export(rev: str, into: Path) -> None:
    """``rev``'s store packages in ``into``, renamed ``dxbase`` and ``dxbase_mongo``."""
    archive = subprocess.run(
        ["git", "archive", rev, "docoutbox", "adapters/docoutbox_mongo"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "docoutbox").rename(into / BASE)
    (into / "adapters" / "docoutbox_mongo").rename(into / f"{BASE}_mongo")
    for path in into.glob(f"{BASE}*/**/*.py"):
        text = path.read_text()
        text = re.sub(r"\bdocoutbox_mongo\b", f"{BASE}_mongo", text)
        text = re.sub(r"\bdocoutbox(?=[.\s])", BASE, text)
        path.write_text(text)


def store_handle(package: str, collection: Any, accounts: list[str]) -> Handle:
    """A warm ``handle`` of ``package``'s store over ``collection``, the workload's."""
    dx = importlib.import_module(package)
    mongo = importlib.import_module(f"{package}_mongo")

    class Account(dx.Aggregate):  # type: ignore[name-defined,misc]
        aggregate_type: ClassVar[str] = "Account"
        balance: int = 0
        deposits: int = 0

    handlers = dx.Handlers()

    @handlers.on("Deposit")  # type: ignore[untyped-decorator]
    def deposit(state: Any, message: Any) -> Any:
        n = message.payload["n"]
        update = {"balance": state.balance + n, "deposits": state.deposits + 1}
        return dx.Decision(state.model_copy(update=update))

    store = dx.AggregateStore(mongo.MongoBackend(collection), Account, dx.StoreConfig())
    for account in accounts:
        store.create(account, Account())

    def handle(account: str, message: dict[str, Any]) -> None:
        if not store.handle(account, message, handlers).applied:
            raise AssertionError(f"{account}: message {message['id']} not applied")

    return handle


def paired(samples: dict[str, list[float]], name: str, base: str) -> str:
    ratios = sorted(a / b for a, b in zip(samples[name], samples[base], strict=True))
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f}x ({low:.2f}-{high:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__)
    parser.add_argument("rev", help="the commit whose store is compared with this one")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--messages", type=int, default=300)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, mongo_server() as uri:
        export(args.rev, Path(folder))
        sys.path.insert(0, folder)
        client = connect(uri)
        accounts = account_ids(20)
        variants: dict[str, tuple[Handle, Feed]] = {}
        raw = new_collection(client, "ab_raw")
        create_accounts(raw, accounts)
        variants["raw cached update"] = (
            RawLoop(raw, window=100, cached=True).handle,
            Feed(accounts, emit=False),
        )
        for name, package in ((args.rev, BASE), ("this tree", "docoutbox")):
            coll = new_collection(client, f"ab_{package}")
            variants[name] = (store_handle(package, coll, accounts), Feed(accounts, emit=False))
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        try:
            for index in range(args.rounds + 2):  # two rounds of warm-up
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    handle, feed = variants[name]
                    batch = feed.take(args.messages)
                    gc.collect()
                    began, spent = time.perf_counter(), time.process_time()
                    for account, message in batch:
                        handle(account, message)
                    wall = time.perf_counter() - began
                    if index >= 2:
                        rates[name].append(len(batch) / wall)
                        cpu[name].append((time.process_time() - spent) / len(batch) * 1e6)
        finally:
            client.drop_database("docoutbox_bench")
            client.close()
    print(f"{args.rounds} rounds of {args.messages} messages per variant")
    for name in names:
        print(
            f"{name}: {statistics.median(rates[name]):,.0f} msgs/s, "
            f"client CPU {statistics.median(cpu[name]):.1f} µs/msg, "
            f"vs raw cached update {paired(rates, name, names[0])}"
        )
    print(f"this tree vs {args.rev}: {paired(rates, names[2], names[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
