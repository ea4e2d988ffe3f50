"""FastStream integration: a FastStream subscriber hands messages to a docoutbox store (the
aggregate's inbox de-duplicates them, what the handler emits goes to its outbox), and the
dispatcher publishes the outbox through the FastStream broker object; the same
exactly-once checks under FastStream's TestRabbitBroker and on a real RabbitMQ."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("faststream")

from faststream.rabbit import RabbitBroker
from faststream.rabbit.testing import TestRabbitBroker

from benchmarks.rabbit import Sandbox
from docoutbox import AsyncAggregateStore, AsyncDispatcher, DispatcherConfig
from docoutbox.errors import PublishError
from docoutbox.model import OutboxMessage
from docoutbox.testing import AsyncMemoryBackend, MemoryDeadLetters
from docoutbox_app.endpoint import payload_field
from docoutbox_app.faststream import FastStreamPublisher, StoreSubscriber, subscribe
from examples.order_inventory import domain
from tests.support.e2e import require_rabbitmq

ORDERS = 6


def body(mid: str, kind: str, **payload: Any) -> bytes:
    return json.dumps({"id": mid, "type": kind, "payload": payload}).encode()


class Shop:
    """An inventory subscriber on a memory store, and a replies queue read back."""

    def __init__(self, broker: RabbitBroker, queue: str, replies: str) -> None:
        self.store = AsyncAggregateStore(AsyncMemoryBackend(), domain.Stock)
        self.subscriber = StoreSubscriber(
            self.store,
            domain.inventory,
            payload_field("sku"),
            creates={"Restock", "ReserveStock"},
            name=queue,
        )
        subscribe(broker, queue, self.subscriber)
        self.replies: list[dict[str, Any]] = []

        @broker.subscriber(replies)
        async def reply(message: dict[str, Any]) -> None:
            self.replies.append(message)

        self.publisher = FastStreamPublisher(broker, exchange="", routing_key=replies)

    @asynccontextmanager
    async def dispatching(self) -> AsyncIterator[AsyncDispatcher]:
        config = DispatcherConfig(sweep_interval=0.02, grace=0.0, poll_interval=0.01)
        dispatcher = AsyncDispatcher(
            self.store.backend, self.publisher, MemoryDeadLetters(), config=config
        )
        task = asyncio.create_task(dispatcher.run())
        try:
            yield dispatcher
        finally:
            dispatcher.stop()
            await task

    async def settle(self, count: int, deadline: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        while loop.time() < end:
            pending = [e async for s in self.store.pending() for e in s.outbox]
            if len(self.replies) >= count and not pending:
                return
            await asyncio.sleep(0.02)


async def scenario(
    broker: Any, publish: Callable[[bytes, str], Any], queue: str, shop: Shop
) -> None:
    async with shop.dispatching():
        for _ in range(2):  # the command redelivered
            await publish(body("r-1", "Restock", sku="apple", qty=7), queue)
        for n in range(ORDERS):
            reserve = body(f"q-{n}", "ReserveStock", order_id=f"o-{n}", sku="apple", qty=2)
            await publish(reserve, queue)
            await publish(reserve, queue)  # a duplicated delivery
        await shop.settle(ORDERS)
    snapshot = await shop.store.load("apple")
    assert snapshot is not None
    assert snapshot.state.available == 1
    assert sorted(snapshot.state.reserved) == ["o-0", "o-1", "o-2"]
    stats = shop.subscriber.stats
    assert (stats.applied, stats.duplicates, stats.rejected) == (1 + ORDERS, 1 + ORDERS, 0)
    kinds = sorted(reply["type"] for reply in shop.replies)
    assert kinds == ["StockRefused"] * 3 + ["StockReserved"] * 3
    assert len({reply["id"] for reply in shop.replies}) == ORDERS  # each published once


def test_under_faststreams_test_broker() -> None:
    async def run() -> None:
        broker = RabbitBroker("amqp://guest:guest@127.0.0.1:5672/")
        shop = Shop(broker, "inventory", "replies")
        async with TestRabbitBroker(broker) as test_broker:

            async def publish(data: bytes, queue: str) -> None:
                await test_broker.publish(data, queue=queue)

            await scenario(test_broker, publish, "inventory", shop)

    asyncio.run(run())


@pytest.mark.rabbitmq
def test_on_a_real_rabbitmq(box: Sandbox) -> None:
    url = require_rabbitmq()
    queue, replies = f"fs-inv-{uuid.uuid4().hex[:8]}", f"fs-rep-{uuid.uuid4().hex[:8]}"
    box.queues += [queue, replies]

    async def run() -> None:
        broker = RabbitBroker(url)
        shop = Shop(broker, queue, replies)
        async with broker:
            await broker.start()

            async def publish(data: bytes, queue: str) -> None:
                await broker.publish(data, queue=queue, persist=True)

            await scenario(broker, publish, queue, shop)

    asyncio.run(run())


def test_a_failed_publish_raises_and_names_the_entry() -> None:
    class Refusing:
        async def publish(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionError("broker gone")

    entry = OutboxMessage.model_validate(
        {
            "id": "e-1",
            "type": "StockReserved",
            "payload": {},
            "created_at": "2026-01-01T00:00:00Z",
            "seq": 1,
            "aggregate_id": "apple",
            "aggregate_type": "Stock",
        }
    )
    with pytest.raises(PublishError, match="entry e-1: FastStream publish failed: ConnectionError"):
        asyncio.run(FastStreamPublisher(Refusing()).publish(entry))


@pytest.mark.rabbitmq
def test_an_unroutable_publish_raises_instead_of_being_dropped(box: Sandbox) -> None:
    """RabbitMQ returns a mandatory message no queue is bound for, then confirms it;
    FastStream hands the return back as the publish's result. The entry must stay
    pending, not be counted as published."""
    url = require_rabbitmq()
    exchange, queue, _ = box.names()
    box.channel.exchange_declare(exchange, exchange_type="direct")
    box.channel.queue_declare(queue)
    box.channel.queue_bind(queue, exchange, routing_key="StockReserved")
    entry = OutboxMessage.model_validate(
        {
            "id": "e-2",
            "type": "StockRefused",
            "payload": {},
            "created_at": "2026-01-01T00:00:00Z",
            "seq": 1,
            "aggregate_id": "apple",
            "aggregate_type": "Stock",
        }
    )

    async def run() -> None:
        broker = RabbitBroker(url)
        async with broker:
            publisher = FastStreamPublisher(broker, exchange=exchange)
            with pytest.raises(PublishError, match="entry e-2: returned unroutable"):
                await publisher.publish(entry)
            routed = entry.model_copy(update={"id": "e-3", "type": "StockReserved"})
            await publisher.publish(routed)  # a routed one still goes through

    asyncio.run(run())
    assert [props.message_id for props, _ in box.drain(queue)] == ["e-3"]
