"""The operating commands end to end on the wire server and RabbitMQ.

A poisoned entry lands in the dead letters (refused by the broker side, or rejected by a
consumer), is listed and shown, replayed, and then consumed exactly once. Bad input
changes nothing.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pydantic import Field

from benchmarks.ledger import Ledger, by_source, record
from benchmarks.rabbit import Sandbox
from docoutbox import AggregateStore, Decision, Handlers, InboxPolicy, Message, StoreConfig, emit
from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.errors import PermanentPublishError
from docoutbox.model import Aggregate, OutboxMessage
from docoutbox.receive import HandlerRetry
from docoutbox_app.cli import main
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.coordination import MongoDeadLetters, MongoLeaseTable
from docoutbox_mongo.kit import open_kit
from docoutbox_rabbitmq import RabbitConsumer, RabbitPublisher

pytestmark = [pytest.mark.wire, pytest.mark.rabbitmq]


class Order(Aggregate):
    lines: int = 0


order_handlers: Handlers[Order] = Handlers()


@order_handlers.on("Place")
def place(state: Order, message: Message) -> Decision[Order]:
    kinds = message.payload.get("emit", [])
    assert isinstance(kinds, list)
    emits = [emit(str(kind), {"n": 1}) for kind in kinds]
    return Decision(state.model_copy(update={"lines": state.lines + len(emits)}), *emits)


class Poisonable:
    """Refuses entries of type ``Poison`` for good while ``poisoned`` is set."""

    def __init__(self, inner: RabbitPublisher) -> None:
        self.inner = inner
        self.poisoned = True

    def publish(self, entry: OutboxMessage) -> None:
        if self.poisoned and entry.type == "Poison":
            raise PermanentPublishError(f"entry {entry.id}: Poison refused")
        self.inner.publish(entry)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def queue(box: Sandbox) -> str:
    _, name, _dead = box.names(exchange=False)
    with RabbitPublisher(box.url) as publisher:
        publisher.declare(queues={name: []})
    return name


def _consume(url: str, queue: str, store: AggregateStore[Any], handlers: Any, **kw: Any) -> Any:
    consumer = RabbitConsumer(url, queue, store, handlers, **kw)
    try:
        return consumer.run(idle_timeout=1.0)
    finally:
        consumer.close()


def test_an_entry_the_broker_refused_is_listed_replayed_and_consumed_once(
    mongo: Any, mongo_uri: str, box: Sandbox, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = mongo.name
    common = ("--mongo-uri", mongo_uri, "--db", db)
    orders = AggregateStore(MongoBackend(mongo["orders"]), Order)
    orders.handle(
        "o1",
        Message(id="m1", type="Place", payload={"emit": ["Event"]}),
        order_handlers,
        create=True,
    )
    orders.handle(
        "o1",
        Message(id="m2", type="Place", payload={"emit": ["Poison", "Event"]}),
        order_handlers,
    )
    target = open_kit(mongo_uri, db, "orders")
    publisher = Poisonable(RabbitPublisher(box.url, routing_key=queue))
    dispatcher = Dispatcher(
        target.backend,
        publisher,
        target.dead_letters,
        source=target.source,
        checkpoints=target.checkpoints,
        config=DispatcherConfig(name=f"adm-{uuid.uuid4().hex[:6]}", sweep_interval=0.5, grace=0),
    )
    thread = threading.Thread(target=dispatcher.run)
    thread.start()
    try:
        dead = mongo["docoutbox_dead_letters"]
        wait_for(lambda: dead.count_documents({}) == 1)
        wait_for(lambda: not orders.get("o1").outbox)

        code, out, _ = run_cli(capsys, "dead-letters", "list", *common, "--json")
        assert code == 0
        (row,) = json.loads(out)
        assert (row["type"], row["seq"], row["origin"]) == ("Poison", 2, "dispatch")
        assert "Poison refused" in row["error"]
        poison_id = row["id"]
        code, out, _ = run_cli(capsys, "dead-letters", "list", *common)
        assert code == 0 and poison_id in out and "1 dead letter" in out
        code, out, _ = run_cli(capsys, "dead-letters", "show", *common, poison_id)
        assert code == 0 and json.loads(out)["entry"]["id"] == poison_id

        # Bad input: a clear message, a failing exit, nothing changed.
        code, _, err = run_cli(
            capsys, "dead-letters", "replay", *common, "--collection", "orders", poison_id, "nope"
        )
        assert code == 1 and "no dead letter 'nope'" in err
        code, _, err = run_cli(capsys, "dead-letters", "show", *common, "nope")
        assert code == 1 and "nope" in err
        code, _, err = run_cli(capsys, "dead-letters", "purge", *common)
        assert code == 2 and "--yes" in err
        code, _, err = run_cli(capsys, "dead-letters", "replay", *common, poison_id)
        assert code == 2 and "--collection" in err
        assert dead.count_documents({}) == 1 and not orders.get("o1").outbox

        publisher.poisoned = False
        code, out, _ = run_cli(
            capsys, "dead-letters", "replay", *common, "--collection", "orders", poison_id
        )
        assert code == 0 and f"{poison_id}: re-appended" in out and "seq 2" in out
        wait_for(lambda: dead.count_documents({}) == 0 and not orders.get("o1").outbox)
        assert orders.get("o1").version == 2  # a replay never bumps the version
    finally:
        dispatcher.stop()
        thread.join()
        target.close()

    ledger = AggregateStore(
        MongoBackend(mongo["ledger"]), Ledger, StoreConfig(inbox=InboxPolicy(window=0, exact=True))
    )
    received = _consume(
        box.url, queue, ledger, _ledger_with_poison(), aggregate_id_of=by_source, create=True
    )
    assert received.applied == 3 and received.rejected == 0
    (state,) = [s.state for s in [ledger.get("Order/o1")]]
    assert sorted(state.seqs["Order/o1"]) == [1, 2, 3]  # each exactly once, gap filled
    assert state.total == 3


def _ledger_with_poison() -> Handlers[Ledger]:
    handlers: Handlers[Ledger] = Handlers()
    handlers.on("Event", "Poison")(record)
    return handlers


class Tally(Aggregate):
    seen: list[str] = Field(default_factory=list)


def test_a_delivery_a_consumer_rejected_is_listed_replayed_and_consumed_once(
    mongo: Any, mongo_uri: str, box: Sandbox, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain message (not from docoutbox) whose handler keeps failing: retried, then kept
    in the same dead letters as the dispatcher's, with its error; replayed to its queue."""
    common = ("--mongo-uri", mongo_uri, "--db", mongo.name)
    broken = {"on": True}
    calls: list[str] = []
    handlers: Handlers[Tally] = Handlers()

    @handlers.on("Ping")
    def ping(state: Tally, message: Message) -> Tally:
        calls.append(message.id)
        if broken["on"]:
            raise RuntimeError("tally is broken")
        return Tally(seen=[*state.seen, message.id])

    tallies = AggregateStore(MongoBackend(mongo["tallies"]), Tally)
    body = json.dumps({"id": "plain-1", "type": "Ping", "payload": {"x": 1}, "extra": 0})

    connection = pika.BlockingConnection(pika.URLParameters(box.url))
    connection.channel().basic_publish("", queue, body.encode())
    connection.close()

    dead_letters = MongoDeadLetters(mongo["docoutbox_dead_letters"])
    options: dict[str, Any] = {
        "aggregate_id_of": lambda m: "t1",
        "create": True,
        "retry": HandlerRetry(immediate=1, delayed=2, base_delay=0.01),
        "dead_letters": dead_letters,
    }
    stats = _consume(box.url, queue, tallies, handlers, **options)
    assert stats.rejected == 1 and stats.dead_lettered == 1 and stats.retried == 3
    assert calls == ["plain-1"] * 4
    assert box.depth(queue) == 0

    code, out, _ = run_cli(capsys, "dead-letters", "list", *common, "--json")
    (row,) = json.loads(out)
    assert (row["id"], row["origin"], row["queue"], row["attempts"]) == (
        "plain-1",
        "consume",
        queue,
        4,
    )
    assert "tally is broken" in row["error"]

    code, _, err = run_cli(capsys, "dead-letters", "replay", *common, "plain-1")
    assert code == 2 and "--rabbitmq-url" in err
    assert mongo["docoutbox_dead_letters"].count_documents({}) == 1 and box.depth(queue) == 0

    broken["on"] = False
    code, out, _ = run_cli(
        capsys, "dead-letters", "replay", *common, "--rabbitmq-url", box.url, "plain-1"
    )
    assert code == 0 and "plain-1: republished" in out
    assert mongo["docoutbox_dead_letters"].count_documents({}) == 0
    stats = _consume(box.url, queue, tallies, handlers, **options)
    assert stats.applied == 1 and stats.rejected == 0
    assert tallies.get("t1").state.seen == ["plain-1"]


def test_replaying_for_a_vanished_aggregate_changes_nothing(
    mongo: Any, mongo_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("--mongo-uri", mongo_uri, "--db", mongo.name)
    orders = AggregateStore(MongoBackend(mongo["orders"]), Order)
    outcome = orders.handle(
        "gone",
        Message(id="m1", type="Place", payload={"emit": ["Event"]}),
        order_handlers,
        create=True,
    )
    (entry,) = outcome.emitted
    MongoDeadLetters(mongo["docoutbox_dead_letters"]).put("gone", entry.model_dump(), "E", 5)
    mongo["orders"].delete_one({"_id": "gone"})

    code, _, err = run_cli(
        capsys, "dead-letters", "replay", *common, "--collection", "orders", entry.id
    )
    assert code == 1 and "'gone' no longer exists" in err and "nothing was replayed" in err
    assert mongo["docoutbox_dead_letters"].count_documents({}) == 1

    code, out, _ = run_cli(capsys, "dead-letters", "purge", *common, "--yes", entry.id)
    assert code == 0 and "purged 1" in out
    assert mongo["docoutbox_dead_letters"].count_documents({}) == 0


def test_outbox_stats_match_the_database(
    mongo: Any, mongo_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    orders = AggregateStore(MongoBackend(mongo["orders"]), Order, StoreConfig(partitions=4))
    for n in range(5):
        kinds = ["A"] * (n + 1) + ["B"]
        orders.handle(
            f"o{n}",
            Message(id=f"m{n}", type="Place", payload={"emit": kinds}),
            order_handlers,
            create=True,
        )
    orders.handle(
        "empty", Message(id="e", type="Place", payload={"emit": []}), order_handlers, create=True
    )
    where = ("--mongo-uri", mongo_uri, "--db", mongo.name, "--collection", "orders")
    code, out, _ = run_cli(capsys, "outbox", "stats", *where, "--json")
    assert code == 0
    stats = json.loads(out)
    assert (stats["entries"], stats["aggregates"]) == (20, 5)
    assert stats["by_type"]["A"] == {**stats["by_type"]["A"], "entries": 15, "aggregates": 5}
    assert stats["by_type"]["B"]["entries"] == 5
    docs = list(mongo["orders"].find({"outbox.0": {"$exists": True}}))
    per_partition: dict[str, int] = {}
    for doc in docs:
        key = str(doc["partition"])
        per_partition[key] = per_partition.get(key, 0) + len(doc["outbox"])
    assert {p: b["entries"] for p, b in stats["by_partition"].items()} == per_partition
    assert 0 <= stats["oldest_age_s"] < 60
    code, out, _ = run_cli(capsys, "outbox", "stats", *where)
    assert code == 0 and "20 entries on 5 aggregates" in out


def test_leases_show_owner_and_since(
    mongo: Any, mongo_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = MongoLeaseTable(mongo["docoutbox_leases"], "orders")
    keeper = LeaseKeeper(table, partitions=4, owner="inst-a", timing=LeaseTiming(ttl=5.0))
    keeper.start()
    try:
        wait_for(lambda: len(keeper.owned() or ()) == 4)
        code, out, _ = run_cli(
            capsys, "leases", "--mongo-uri", mongo_uri, "--db", mongo.name, "--json"
        )
        assert code == 0
        rows = json.loads(out)
        leases = [r for r in rows if r["partition"] is not None]
        assert [r["partition"] for r in leases] == [0, 1, 2, 3]
        assert {r["owner"] for r in rows} == {"inst-a"}
        assert all(r["since"] and not r["expired"] for r in rows)
        code, out, _ = run_cli(capsys, "leases", "--mongo-uri", mongo_uri, "--db", mongo.name)
        assert code == 0 and "inst-a" in out and "member" in out
    finally:
        keeper.stop()


def test_help_shows_defaults_version_and_whole_demo_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("docoutbox ")
    with pytest.raises(SystemExit):
        main(["dispatch", "--help"])
    out = capsys.readouterr().out
    assert "(default: 16)" in out and "default: 60.0" in out
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "runs it on MongoDB (change streams)." in out and "(default: 25)" in out
