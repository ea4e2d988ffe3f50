"""The Inventory service as a FastStream app on MongoDB + RabbitMQ: the same domain, queue
and collection as the Inventory endpoint, run instead of it::

    faststream run examples.order_inventory.faststream_inventory:app

The subscriber hands each message to the stock store (its inbox de-duplicates, its outbox
takes the replies); the dispatcher publishes the outbox through the app's broker.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from faststream import FastStream
from faststream.rabbit import RabbitBroker

from docoutbox import AsyncAggregateStore
from docoutbox_app import DispatchOptions, build_async_dispatcher
from docoutbox_app.endpoint import payload_field
from docoutbox_app.faststream import FastStreamPublisher, StoreSubscriber, subscribe
from docoutbox_mongo import open_async_kit
from examples.order_inventory import domain

SHOP = os.environ.get("SHOP", "shop")
broker = RabbitBroker(os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"))
app = FastStream(broker)
running: dict[str, Any] = {}


@app.on_startup
async def open_stock() -> None:
    kit = await open_async_kit(os.environ.get("MONGODB_URI", "mongodb://127.0.0.1"), SHOP, "stock")
    stock = StoreSubscriber(
        AsyncAggregateStore(kit.backend, domain.Stock),
        domain.inventory,
        payload_field("sku"),
        creates={"Restock", "ReserveStock"},
        dead_letters=kit.dead_letters,
    )
    subscribe(broker, f"{SHOP}.inventory", stock)
    publisher = FastStreamPublisher(broker, exchange=SHOP)
    running.update(
        kit=kit,
        dispatcher=build_async_dispatcher(kit, publisher, DispatchOptions(name="inventory")),
    )


@app.after_startup
async def dispatch() -> None:
    running["task"] = asyncio.create_task(running["dispatcher"].run())


@app.on_shutdown
async def close_stock() -> None:
    running["dispatcher"].stop()  # finishes the publishes in flight, releases the leases
    await running["task"]
    await running["kit"].close()
