"""The order and stock process with no broker, under faults: lost replies (redelivery),
failed deliveries, ambiguous store writes, concurrent dispatchers, and dispatchers that
crash and are replaced. In the end every order is settled, stock is conserved, and every
message took effect exactly once."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox import AsyncAggregateStore, InvalidInput, Message, OutboxMessage
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.scheduler import Backoff
from docoutbox.dispatch.extras.local import AsyncLocalPublisher, LocalPublisher, Route
from docoutbox.errors import BrokerUnavailable, PermanentPublishError, TransientStoreError
from docoutbox.store.plans import CommitPlan, WritePlan
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend, MemoryDeadLetters
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints
from docoutbox_mongo import MongoBackend
from examples.order_stock.process import (
    EXACT,
    Order,
    Stock,
    order_handlers,
    publisher,
    stock_handlers,
    stores,
)

SKUS = [f"sku-{i}" for i in range(5)]
START = 12
CONFIG = DispatcherConfig(
    concurrency=4,
    sweep_interval=0.2,
    grace=0.0,
    poll_interval=0.005,
    checkpoint_interval=0,
    policy=DispatchPolicy(max_attempts=1000, base_delay=0.001, max_delay=0.01),
    backoff=Backoff(base=0.002, cap=0.02),
)


class Shaky:
    """A store backend whose commits sometimes apply and then report an error, as when
    the reply is lost."""

    def __init__(self, inner: Any, rng: random.Random, lock: threading.Lock) -> None:
        self.inner = inner
        self.rng = rng
        self.rng_lock = lock
        self.armed = False
        self.max_document_bytes = inner.max_document_bytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, plan: WritePlan) -> bool:
        applied: bool = self.inner.write(plan)
        with self.rng_lock:
            lost = self.armed and isinstance(plan, CommitPlan) and self.rng.random() < 0.05
        if lost:
            raise TransientStoreError("reply lost")
        return applied


class Flaky:
    """Fails some deliveries before handling, and loses the answer of others after."""

    def __init__(self, inner: LocalPublisher, rng: random.Random, lock: threading.Lock) -> None:
        self.inner = inner
        self.rng = rng
        self.lock = lock
        self.lost_answers = 0

    def _roll(self) -> float:
        with self.lock:
            return self.rng.random()

    def publish(self, entry: OutboxMessage) -> None:
        if self._roll() < 0.05:
            raise BrokerUnavailable("receiver unreachable")
        self.inner.publish(entry)
        if self._roll() < 0.1:
            self.lost_answers += 1
            raise BrokerUnavailable("answer lost after delivery")


class Fleet:
    """Dispatchers for one collection: two at a time, one replaced now and then."""

    def __init__(
        self, backend: Any, publisher: Any, dead: MemoryDeadLetters, *, stream: bool
    ) -> None:
        self.backend = backend
        self.stream = stream
        self.publisher = publisher
        self.dead = dead
        self.running: list[tuple[Dispatcher, threading.Thread]] = []
        self.crashes = 0

    def start_one(self) -> None:
        dispatcher = Dispatcher(
            self.backend,
            self.publisher,
            self.dead,
            source=MemoryChangeSource(self.backend.inner) if self.stream else None,
            checkpoints=MemoryCheckpoints() if self.stream else None,
            config=CONFIG,
        )
        thread = threading.Thread(target=dispatcher.run, daemon=True)
        thread.start()
        assert dispatcher.started.wait(5)
        self.running.append((dispatcher, thread))

    def crash_one(self, rng: random.Random) -> None:
        dispatcher, thread = self.running.pop(rng.randrange(len(self.running)))
        dispatcher.halt()
        thread.join(10)
        self.crashes += 1
        self.start_one()

    def stop(self) -> None:
        for dispatcher, thread in self.running:
            dispatcher.stop()
            thread.join(10)


def pending(backend: Shaky) -> int:
    return sum(
        len(doc.get("outbox") or []) for doc in backend.find_pending(after=None, limit=10**6)
    )


@pytest.fixture(params=["memory", "wire"])
def collections(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """Two collections of one database: orders and stocks."""
    if request.param == "memory":
        yield MemoryBackend(), MemoryBackend()
        return

    client: Any = MongoClient(request.getfixturevalue("mongo_uri"), uuidRepresentation="standard")
    db = client[f"order_stock_{uuid.uuid4().hex[:8]}"]
    yield MongoBackend(db["orders"]), MongoBackend(db["stocks"])
    client.drop_database(db.name)
    client.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_order_and_stock_without_a_broker_under_faults(
    seed: int, collections: tuple[Any, Any]
) -> None:
    rng = random.Random(seed)
    lock = threading.Lock()
    orders_backend, stocks_backend = (Shaky(c, rng, lock) for c in collections)
    stream = isinstance(collections[0], MemoryBackend)  # the wire server: sweeps only
    orders, stocks = stores(orders_backend, stocks_backend)
    for sku in SKUS:
        stocks.create(sku, Stock(available=START))
    orders_backend.armed = stocks_backend.armed = True
    flaky = Flaky(publisher(orders, stocks), rng, lock)
    dead = MemoryDeadLetters()
    fleets = [
        Fleet(orders_backend, flaky, dead, stream=stream),
        Fleet(stocks_backend, flaky, dead, stream=stream),
    ]
    for fleet in fleets:
        fleet.start_one()
        fleet.start_one()

    placed: list[str] = []

    def customer(number: int) -> None:
        local = random.Random(seed * 100 + number)
        for index in range(15):
            order_id = f"o-{number}-{index}"
            skus = local.sample(SKUS, local.randint(1, 3))
            message = Message(
                id=f"place-{order_id}",
                type="PlaceOrder",
                payload={"order_id": order_id, "lines": {s: local.randint(1, 4) for s in skus}},
            )
            # Each order is sent twice (a client retry): the second is a duplicate.
            for _ in range(2):
                while True:
                    try:
                        orders.handle(order_id, message, order_handlers, create=True)
                        break
                    except TransientStoreError:
                        continue  # the client retries: the inbox absorbs the repeat
            placed.append(order_id)

    customers = [threading.Thread(target=customer, args=(n,)) for n in range(3)]
    for t in customers:
        t.start()
    deadline = time.monotonic() + 60
    turn = 0
    while (
        any(t.is_alive() for t in customers) or pending(orders_backend) or pending(stocks_backend)
    ):
        assert time.monotonic() < deadline, "the process did not settle"
        time.sleep(0.02)
        turn += 1
        if turn <= 2 or rng.random() < 0.2:  # crash both fleets early, then now and then
            fleets[turn % 2].crash_one(rng)
    for fleet in fleets:
        fleet.stop()

    assert dead.entries == {}
    assert sum(f.crashes for f in fleets) > 0 and flaky.lost_answers > 0
    final_orders = {oid: orders.get(oid).state for oid in placed}
    final_stocks = {sku: stocks.get(sku).state for sku in SKUS}
    assert len(final_orders) == 45
    for oid, order in final_orders.items():
        assert order.status in {"confirmed", "rejected"}, (oid, order)
        assert len(order.handled) == len(set(order.handled)), oid
        held = {sku for sku, stock in final_stocks.items() if oid in stock.reservations}
        if order.status == "confirmed":
            assert held == set(order.lines)
            for sku in order.lines:
                assert final_stocks[sku].reservations[oid] == order.lines[sku]
        else:
            assert held == set(), (oid, held)
    for sku, stock in final_stocks.items():
        assert len(stock.handled) == len(set(stock.handled)), sku
        assert stock.available + sum(stock.reservations.values()) == START, sku
        assert stock.available >= 0


def test_an_unroutable_entry_is_refused_permanently() -> None:
    orders, stocks = stores(MemoryBackend(), MemoryBackend())
    local = publisher(orders, stocks)
    outcome = orders.handle(
        "o1",
        Message(id="p1", type="PlaceOrder", payload={"order_id": "o1", "lines": {"x": 1}}),
        order_handlers,
        create=True,
    )
    entry = outcome.emitted[0]
    with pytest.raises(PermanentPublishError):
        local.publish(entry)  # the stock "x" does not exist
    with pytest.raises(PermanentPublishError):
        local.publish(entry.model_copy(update={"destination": "Nowhere/1"}))
    with pytest.raises(PermanentPublishError):
        local.publish(entry.model_copy(update={"destination": None}))
    stocks.create("x", Stock(available=5))
    local.publish(entry)
    local.publish(entry)  # a redelivery: the receiver's inbox absorbs it
    assert stocks.get("x").state.available == 4
    assert (local.delivered, local.duplicates) == (1, 1)


def test_order_type_names() -> None:
    assert Order.aggregate_type == "Order"


def test_async_local_publisher_delivers_exactly_once() -> None:
    async def main() -> None:
        orders, _ = stores(MemoryBackend(), MemoryBackend())
        stocks = AsyncAggregateStore(AsyncMemoryBackend(), Stock, EXACT)
        await stocks.create("x", Stock(available=5))
        local = AsyncLocalPublisher({"Stock": Route(stocks, stock_handlers)})
        placed = orders.handle(
            "o1",
            Message(id="p1", type="PlaceOrder", payload={"order_id": "o1", "lines": {"x": 2}}),
            order_handlers,
            create=True,
        )
        entry = placed.emitted[0]
        await local.publish(entry)
        await local.publish(entry)  # redelivered: absorbed by the receiver's inbox
        assert (await stocks.get("x")).state.available == 3
        assert (local.delivered, local.duplicates) == (1, 1)
        with pytest.raises(InvalidInput):
            LocalPublisher({"Stock": Route(stocks, stock_handlers)})  # an async store

    asyncio.run(main())
