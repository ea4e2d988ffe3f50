"""``docoutbox outbox stats``, ``docoutbox dead-letters`` and ``docoutbox leases`` on
Cosmos DB (``--cosmos-endpoint``): the same figures, rows and repairs as on MongoDB, on
the containers."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, Message, StoreConfig
from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.tools import replay
from docoutbox.testing import MemoryPublisher
from docoutbox_app.cli import main
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.admin import CosmosDeadLetterStore, lease_rows
from docoutbox_cosmos.coordination import CosmosDeadLetters, CosmosLeaseTable
from docoutbox_cosmos.kit import open_kit
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from tests.integration.test_admin import Order, Poisonable, order_handlers
from tests.support.cosmos import create_container

KEY = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="


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
    cosmos_server: CosmosAccount, cosmos_database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    container = create_container(cosmos_database, "orders")
    orders = AggregateStore(CosmosBackend(container), Order, StoreConfig(partitions=4))
    for n in range(5):
        kinds = ["A"] * (n + 1) + ["B"]
        message = Message(id=f"m{n}", type="Place", payload={"emit": kinds})
        orders.handle(f"o{n}", message, order_handlers, create=True)
    empty = Message(id="e", type="Place", payload={"emit": []})
    orders.handle("empty", empty, order_handlers, create=True)
    where = (*account(cosmos_server, cosmos_database), "--container", "orders")
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
    cosmos_server: CosmosAccount, cosmos_database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monitored = create_container(cosmos_database, "orders")
    table = CosmosFeedRangeLeases(
        create_container(cosmos_database, "docoutbox_leases"), monitored, "orders"
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
        code, out, err = run(capsys, "leases", *account(cosmos_server, cosmos_database), "--json")
        assert code == 0, err
        rows = json.loads(out)
        leases = [r for r in rows if r["partition"] is not None]
        assert [r["partition"] for r in leases] == list(range(table.partitions))
        assert {r["owner"] for r in rows} == {"inst-a"} and {r["group"] for r in rows} == {"orders"}
        assert all(r["since"] and not r["expired"] for r in rows)  # acquired_at, joined_at
        assert [r["partition"] for r in rows if r not in leases] == [None]  # its member row
        code, out, _ = run(
            capsys, "leases", *account(cosmos_server, cosmos_database), "--group", "x"
        )
        assert code == 0 and out.strip() == "no leases"
        code, out, _ = run(capsys, "leases", *account(cosmos_server, cosmos_database))
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


@pytest.mark.cosmos
def test_a_numbered_cosmos_lease_records_when_it_was_acquired(cosmos_database: Any) -> None:
    container = create_container(cosmos_database, "docoutbox_leases")
    table = CosmosLeaseTable(container, "orders")
    now = datetime.now(UTC)
    assert table.acquire(3, "inst-b", now, now + timedelta(seconds=10))
    [row] = lease_rows(container, "orders")
    assert (row.partition, row.owner, row.expired) == (3, "inst-b", False)
    assert row.since is not None and abs((row.since - now).total_seconds()) < 0.01


def wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.cosmos
def test_an_entry_the_broker_refused_is_listed_replayed_and_published_once(
    cosmos_server: CosmosAccount, cosmos_database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    common = account(cosmos_server, cosmos_database)
    orders = AggregateStore(CosmosBackend(create_container(cosmos_database, "orders")), Order)
    first = Message(id="m1", type="Place", payload={"emit": ["Event"]})
    orders.handle("o/1", first, order_handlers, create=True)  # "/" is escaped in item IDs
    second = Message(id="m2", type="Place", payload={"emit": ["Poison", "Event"]})
    orders.handle("o/1", second, order_handlers)
    target = open_kit(cosmos_server.endpoint, cosmos_server.key, cosmos_database.id, "orders")
    sink = MemoryPublisher()
    publisher = Poisonable(sink)  # type: ignore[arg-type]
    config = DispatcherConfig(name="adm", sweep_interval=0.5, grace=0, poll_interval=0.05)
    dispatcher = Dispatcher(
        target.backend,
        publisher,
        target.dead_letters,
        source=target.source,
        checkpoints=target.checkpoints,
        config=config,
    )
    thread = threading.Thread(target=dispatcher.run)
    thread.start()
    try:
        wait_for(lambda: len(sink.ids()) == 2 and not orders.get("o/1").outbox)
        code, out, err = run(capsys, "dead-letters", "list", *common, "--json")
        assert code == 0, err
        (row,) = json.loads(out)
        assert (row["type"], row["seq"], row["origin"]) == ("Poison", 2, "dispatch")
        assert row["aggregate_id"] == "o/1" and "Poison refused" in row["error"]
        poison_id = row["id"]
        code, out, _ = run(capsys, "dead-letters", "list", *common)
        assert code == 0 and poison_id in out and "1 dead letter" in out
        code, out, _ = run(capsys, "dead-letters", "show", *common, poison_id)
        assert code == 0 and json.loads(out)["entry"]["id"] == poison_id

        code, _, err = run(capsys, "dead-letters", "show", *common, "nope")
        assert code == 1 and "no dead letter 'nope'" in err
        replay_args = ("dead-letters", "replay", *common, "--container", "orders")
        code, _, err = run(capsys, *replay_args, poison_id, "nope")
        assert code == 1 and "no dead letter 'nope'" in err  # nothing replayed
        code, _, err = run(capsys, "dead-letters", "purge", *common, poison_id)
        assert code == 2 and "--yes" in err
        assert not orders.get("o/1").outbox

        publisher.poisoned = False
        code, out, err = run(capsys, *replay_args, poison_id)
        assert code == 0 and f"{poison_id}: re-appended" in out and "seq 2" in out, err
        wait_for(lambda: len(sink.ids()) == 3 and not orders.get("o/1").outbox)
        code, out, _ = run(capsys, "dead-letters", "list", *common, "--json")
        assert code == 0 and json.loads(out) == []
        assert orders.get("o/1").version == 2  # a replay never bumps the version
    finally:
        dispatcher.stop()
        thread.join()
        target.close()
    replayed = sink.published[-1]
    assert (replayed.type, replayed.seq) == ("Poison", 2)
    assert replayed.headers["docoutbox-replay-of"] == poison_id
    assert [e.seq for e in sink.published] == [1, 3, 2]  # each once; the gap filled


@pytest.mark.cosmos
def test_a_replay_where_the_seq_is_pending_appends_nothing(cosmos_database: Any) -> None:
    orders = AggregateStore(CosmosBackend(create_container(cosmos_database, "orders")), Order)
    placed = Message(id="m", type="Place", payload={"emit": ["A"]})
    orders.handle("o1", placed, order_handlers, create=True)
    store = CosmosDeadLetterStore(
        create_container(cosmos_database, "dead"), cosmos_database.get_container_client("orders")
    )
    pending = orders.get("o1").outbox[0].model_dump(mode="json")
    assert not store.append("o1", {**pending, "id": "other"})
    assert store.append("o1", {**pending, "id": "other", "seq": 7})
    assert [(e.id, e.seq) for e in orders.get("o1").outbox] == [(pending["id"], 1), ("other", 7)]
    assert store.aggregate_type("o1") == "Order"
    assert store.aggregate_type("gone") is replay.GONE


@pytest.mark.cosmos
def test_purge_deletes_the_named_or_every_dead_letter(
    cosmos_server: CosmosAccount, cosmos_database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = CosmosDeadLetters(create_container(cosmos_database, "docoutbox_dead_letters"))
    for n in range(3):
        entry = {"id": f"e/{n}", "type": "T", "seq": n + 1, "aggregate_id": "a"}
        dead.put("a", entry, "refused", 1)
        time.sleep(0.002)  # quarantined_at is kept to the millisecond
    common = account(cosmos_server, cosmos_database)
    code, out, _ = run(capsys, "dead-letters", "list", *common, "--limit", "2", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ["e/0", "e/1"]  # oldest first
    code, out, _ = run(capsys, "dead-letters", "purge", *common, "e/1", "--yes")
    assert code == 0 and "purged 1 dead letter(s)" in out
    code, out, _ = run(capsys, "dead-letters", "purge", *common, "--yes")
    assert code == 0 and "purged 2 dead letter(s)" in out
    code, out, _ = run(capsys, "dead-letters", "list", *common)
    assert code == 0 and out.startswith("0 dead letter(s)")
