"""``docoutbox dispatch`` on Cosmos DB as a subprocess: SIGTERM, bad arguments, masked key."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_app.cli import main
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from tests.support.cosmos import create_container
from tests.support.processes import CliProcess

KEY = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="


def cli(*args: str, key: str = KEY) -> CliProcess:
    env = {**os.environ, "COSMOS_KEY": key}
    env.pop("COSMOS_ENDPOINT", None)
    return CliProcess(list(args), env, pipes=True)


def test_bad_cosmos_arguments_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COSMOS_KEY", raising=False)
    monkeypatch.delenv("COSMOS_ENDPOINT", raising=False)
    base = ["dispatch", "--database", "d", "--container", "c", "--publisher", "stdout"]
    assert main([*base, "--cosmos-endpoint", "https://x.documents.azure.com/"]) == 2
    assert "--cosmos-key" in capsys.readouterr().err
    both = ["--cosmos-endpoint", "https://x/", "--cosmos-key", KEY, "--mongo-uri", "mongodb://h/"]
    assert main([*base, *both]) == 2
    no_names = ["--cosmos-endpoint", "https://x/", "--cosmos-key", KEY, "--publisher", "stdout"]
    assert main(["dispatch", *no_names]) == 2
    account = ["--cosmos-endpoint", "https://x/", "--cosmos-key", KEY]
    assert main([*base, *account, "--cosmos-ca-file", "/nonexistent/ca.pem"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([*base, *account, "--cosmos-ca-file", __file__, "--cosmos-insecure"]) == 2
    assert "not both" in capsys.readouterr().err
    mongo = ["--mongo-uri", "mongodb://h/", "--cosmos-insecure"]
    assert main([*base, *mongo]) == 2
    assert KEY not in capsys.readouterr().err


def test_an_unreachable_account_is_one_masked_line_and_exit_1() -> None:
    proc = cli(
        "dispatch",
        *("--cosmos-endpoint", "http://127.0.0.1:1/", "--database", "d", "--container", "c"),
        *("--server-timeout", "1", "--publisher", "stdout"),
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith("docoutbox: error: cannot use Cosmos DB"), err
    assert KEY not in err and out == ""


@pytest.mark.cosmos
@pytest.mark.parametrize("flags", [(), ("--async",)], ids=["threaded", "async"])
def test_sigterm_finishes_checkpoints_releases_and_exits_0(
    cosmos_server: CosmosAccount, cosmos_database: Any, flags: tuple[str, ...]
) -> None:
    container = create_container(cosmos_database, "aggs")
    store = AggregateStore(CosmosBackend(container), Counter)
    for i in range(10):
        store.handle(f"early{i % 3}", add_msg(f"e{i}", emits=2), counter_handlers, create=True)
    proc = cli(
        "dispatch",
        *("--cosmos-endpoint", cosmos_server.endpoint, "--database", cosmos_database.id),
        # A heartbeat renews each lease with its own request: on the loaded local server a
        # 2 s TTL can lapse between heartbeats and make work re-publish (tests/README.md).
        *("--container", "aggs", "--publisher", "stdout", "--lease-ttl", "5"),
        *("--name", "cli-test", "--checkpoint-interval", "3600", "--log-level", "DEBUG"),
        *flags,
        key=cosmos_server.key,
    )
    lines = proc.lines()
    try:
        published = [json.loads(lines.get(timeout=60)) for _ in range(20)]
        # Leased instances checkpoint each feed range's continuation in its lease.
        leases = CosmosFeedRangeLeases(
            cosmos_database.get_container_client("docoutbox_leases"), container, "aggs"
        )
        deadline = time.monotonic() + 30
        while len(before := continuations(cosmos_database)) < leases.partitions:
            assert time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.05)
        for i in range(10):
            store.handle(f"late{i % 4}", add_msg(f"l{i}", emits=1), counter_handlers, create=True)
        published += [json.loads(lines.get(timeout=30)) for _ in range(10)]
        _, err = proc.terminate(timeout=30)
    finally:
        proc.close()
    assert proc.returncode == 0, err
    seqs: dict[str, list[int]] = defaultdict(list)
    for entry in published:
        seqs[entry["aggregate_id"]].append(entry["seq"])
    rows = container.query_items(
        "SELECT c.aid, c.outbox_seq FROM c", enable_cross_partition_query=True
    )
    assert seqs == {r["aid"]: list(range(1, r["outbox_seq"] + 1)) for r in rows}
    after = continuations(cosmos_database)
    assert after.keys() == before.keys() and after != before  # written on stop
    view = leases.read()
    assert view.leases == {} and view.members == {}  # released, left the group
    assert "signal_received signal=SIGTERM" in err
    assert "dispatcher_stopped name=cli-test" in err
    assert "published=30" in err
    assert cosmos_server.key not in err
    assert "mode=change-feed" in err and "change-stream" not in err
    (stopped,) = [line for line in err.splitlines() if "dispatcher_stopped" in line]
    assert len(stopped) < 300, stopped  # the continuations by size and hash, not 4 KB
    assert "Connection pool is full" not in err
    last = [line for line in err.splitlines() if "progress published=" in line][-1]
    assert "backlog_entries=0 " in last, last  # measured again for the last line


def continuations(database: Any) -> dict[int, str]:
    """Each feed range's continuation, as stored in its lease."""
    sql = "SELECT c.partition, c.continuation FROM c WHERE c.kind = 'lease'"
    leases = database.get_container_client("docoutbox_leases")
    rows = leases.query_items(sql, enable_cross_partition_query=True)
    return {r["partition"]: r["continuation"] for r in rows if r.get("continuation")}


@pytest.mark.parametrize(
    ("store", "names", "ok"),
    [
        ("cosmos", ("shop.eu", "orders.v2"), True),  # dots are fine in Cosmos DB names
        ("cosmos", ("shop", "a/b"), False),
        ("cosmos", ("sh#op", "c"), False),
        ("cosmos", ("shop ", "c"), False),
        ("cosmos", ("d", "c" * 256), False),
        ("mongo", ("shop.eu", "c"), False),  # but not in MongoDB database names
        ("mongo", ("shop", "orders.v2"), True),
        ("mongo", ("shop", "a$b"), False),
    ],
)
def test_names_follow_the_rules_of_the_store_in_use(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    names: tuple[str, str],
    ok: bool,
) -> None:
    """A Cosmos DB database named ``shop.eu`` was refused by MongoDB's rule."""
    monkeypatch.delenv("COSMOS_ENDPOINT", raising=False)
    monkeypatch.delenv("DOCOUTBOX_MONGO_URI", raising=False)
    account = (
        ["--cosmos-endpoint", "http://127.0.0.1:1/", "--cosmos-key", KEY]
        if store == "cosmos"
        else ["--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"]
    )
    args = ["dispatch", "--database", names[0], "--container", names[1], "--publisher", "stdout"]
    try:
        code = main([*args, *account, "--server-timeout", "0.5"])
    except SystemExit as exit:  # argparse refused an option
        code = exit.code
    err = capsys.readouterr().err
    if ok:
        # Past the argument checks: it fails to reach the (absent) server instead.
        assert code == 1 and "name" not in err, err
    else:
        assert code == 2 and "not a usable" in err, err
