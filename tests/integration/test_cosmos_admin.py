"""``docoutbox outbox stats`` and ``docoutbox leases`` on Cosmos DB (``--cosmos-endpoint``):
the same figures and rows as on MongoDB, read from the containers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, Message, StoreConfig
from docoutbox.cli import main
from docoutbox.dispatch.leases import LeaseTiming
from docoutbox.dispatch.ownership import LeaseKeeper
from docoutbox_cosmos import CosmosBackend, CosmosFeedRangeLeases, CosmosLeaseTable
from docoutbox_cosmos.admin import lease_rows
from tests.integration.test_admin import Order, order_handlers
from tests.support.cosmos import create_container, scratch_database
from tests.support.servers import CosmosAccount

KEY = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="


@pytest.fixture
def database(cosmos_server: CosmosAccount) -> Iterator[Any]:
    with scratch_database(cosmos_server) as db:
        yield db


@pytest.fixture(autouse=True)
def _no_account_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COSMOS_ENDPOINT", "COSMOS_KEY", "COSMOS_CA_FILE", "DOCOUTBOX_MONGO_URI"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exit:  # argparse refused an option
        code = int(exit.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def account(server: CosmosAccount, database: Any) -> tuple[str, ...]:
    return ("--cosmos-endpoint", server.endpoint, "--cosmos-key", server.key, "--db", database.id)


@pytest.mark.cosmos
def test_outbox_stats_match_the_container(
    cosmos_server: CosmosAccount, database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    container = create_container(database, "orders")
    orders = AggregateStore(CosmosBackend(container), Order, StoreConfig(partitions=4))
    for n in range(5):
        kinds = ["A"] * (n + 1) + ["B"]
        message = Message(id=f"m{n}", type="Place", payload={"emit": kinds})
        orders.handle(f"o{n}", message, order_handlers, create=True)
    empty = Message(id="e", type="Place", payload={"emit": []})
    orders.handle("empty", empty, order_handlers, create=True)
    where = (*account(cosmos_server, database), "--container", "orders")
    code, out, err = run(capsys, "outbox", "stats", *where, "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert (stats["entries"], stats["aggregates"]) == (20, 5)
    assert stats["by_type"]["A"]["entries"] == 15 and stats["by_type"]["A"]["aggregates"] == 5
    assert stats["by_type"]["B"]["entries"] == 5
    per_partition: dict[str, int] = {}
    for n in range(5):
        snapshot = orders.load(f"o{n}")
        assert snapshot is not None
        key = str(snapshot.partition)
        per_partition[key] = per_partition.get(key, 0) + len(snapshot.outbox)
    assert {p: b["entries"] for p, b in stats["by_partition"].items()} == per_partition
    assert 0 <= stats["oldest_age_s"] < 60
    code, out, _ = run(capsys, "outbox", "stats", *where)
    assert code == 0 and "20 entries on 5 aggregates" in out
    assert cosmos_server.key not in out


@pytest.mark.cosmos
def test_leases_show_each_feed_range_owner_and_since(
    cosmos_server: CosmosAccount, database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monitored = create_container(database, "orders")
    table = CosmosFeedRangeLeases(
        create_container(database, "docoutbox_leases"), monitored, "orders"
    )
    keeper = LeaseKeeper(
        table, partitions=table.partitions, owner="inst-a", timing=LeaseTiming(ttl=10.0)
    )
    keeper.start()
    try:
        deadline = time.monotonic() + 30
        while len(keeper.owned() or ()) < table.partitions:
            assert time.monotonic() < deadline, "the leases were not acquired"
            time.sleep(0.05)
        code, out, err = run(capsys, "leases", *account(cosmos_server, database), "--json")
        assert code == 0, err
        rows = json.loads(out)
        leases = [r for r in rows if r["partition"] is not None]
        assert [r["partition"] for r in leases] == list(range(table.partitions))
        assert {r["owner"] for r in rows} == {"inst-a"} and {r["group"] for r in rows} == {"orders"}
        assert all(r["since"] and not r["expired"] for r in leases)  # acquired_at, stored
        assert [r["partition"] for r in rows if r not in leases] == [None]  # its member row
        code, out, _ = run(capsys, "leases", *account(cosmos_server, database), "--group", "x")
        assert code == 0 and out.strip() == "no leases"
        code, out, _ = run(capsys, "leases", *account(cosmos_server, database))
        assert code == 0 and "inst-a" in out and "member" in out
    finally:
        keeper.stop()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["outbox", "stats", "--db", "d", "--container", "a/b"], "--collection: not a usable"),
        (["leases", "--db", "d#", "--leases", "l"], "--db: not a usable"),
        (["leases", "--db", "shop.eu", "--leases", "docoutbox.leases"], "cannot use Cosmos DB"),
    ],
)
def test_cosmos_names_follow_cosmos_rules(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    """Dots are fine in Cosmos DB names (refused for a MongoDB database); ``/`` and ``#``
    are not. A name past the checks fails to reach the (absent) account instead."""
    where = ["--cosmos-endpoint", "http://127.0.0.1:1/", "--cosmos-key", KEY]
    code, out, err = run(capsys, *args, *where, "--server-timeout", "0.5")
    assert code == (1 if needle.startswith("cannot") else 2) and needle in err, err
    assert KEY not in err and out == ""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cosmos-endpoint", "http://h/"], "needs --cosmos-key"),
        (
            ["--cosmos-endpoint", "http://h/", "--cosmos-key", KEY, "--mongo-uri", "mongodb://h/"],
            "not both",
        ),
        (["--mongo-uri", "mongodb://h/", "--cosmos-insecure"], "apply to --cosmos-endpoint only"),
        ([], "--mongo-uri (or DOCOUTBOX_MONGO_URI) is required, or --cosmos-endpoint"),
    ],
)
def test_bad_store_options_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, _, err = run(capsys, "leases", "--db", "d", *args)
    assert code == 2 and needle in err and KEY not in err, err


def test_dead_letters_stay_on_mongodb(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "dead-letters", "list", "--db", "d", "--cosmos-endpoint", "http://h/"
    )
    assert code == 2 and "unrecognized arguments: --cosmos-endpoint" in err


@pytest.mark.cosmos
def test_a_numbered_cosmos_lease_records_when_it_was_acquired(database: Any) -> None:
    container = create_container(database, "docoutbox_leases")
    table = CosmosLeaseTable(container, "orders")
    now = datetime.now(UTC)
    assert table.acquire(3, "inst-b", now, now + timedelta(seconds=10))
    [row] = lease_rows(container, "orders")
    assert (row.partition, row.owner, row.expired) == (3, "inst-b", False)
    assert row.since is not None and abs((row.since - now).total_seconds()) < 0.01
