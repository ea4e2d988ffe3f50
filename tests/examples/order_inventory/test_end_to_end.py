"""The Order and Inventory endpoints end to end on RabbitMQ and the MongoDB wire server, or
the local Cosmos DB server (the same user code but for the store): commands published
twice (redelivered), every outbox entry published twice (a broker that duplicates), and
still every effect exactly once, every outbox empty and every queue drained at the end."""

from __future__ import annotations

import asyncio
import json
import runpy
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from docoutbox.model import OutboxMessage
from docoutbox_app.endpoint import Endpoint, serve
from docoutbox_rabbitmq import RabbitPublisher
from tests.examples.order_inventory.conftest import Shop

pytestmark = pytest.mark.rabbitmq

HERE = Path(__file__).resolve().parents[3] / "examples" / "order_inventory"
ORDERS = 8
STOCK = 11  # enough for five orders of two


class Twice:
    """Publishes every entry twice: the broker delivers each message two times."""

    def __init__(self, inner: RabbitPublisher) -> None:
        self.inner = inner

    def publish(self, entry: OutboxMessage) -> None:
        self.inner.publish(entry)
        self.inner.publish(entry)

    def close(self) -> None:
        self.inner.close()


def test_orders_and_inventory_exactly_once_end_to_end(shop: Shop) -> None:
    module = runpy.run_path(str(HERE / f"{shop.store}.py"))  # read with this test's SHOP
    orders: Endpoint[Any] = module["orders"]
    inventory: Endpoint[Any] = module["inventory"]
    for endpoint in (orders, inventory):
        endpoint.output = Twice(RabbitPublisher(shop.url, exchange=shop.name))
    health: dict[str, Any] = {}

    def settled() -> bool:
        found = shop.orders(ORDERS)
        done = [
            state
            for key, state in found.items()
            if key != "pending" and state.status in ("reserved", "refused")
        ]
        return len(done) == ORDERS and not found["pending"] and not shop.stock()["pending"]

    async def scenario() -> None:
        stop = asyncio.Event()
        port: list[int] = []
        running = asyncio.create_task(
            serve([orders, inventory], stop, health_port=0, serving=port.append)
        )
        restock = {"id": "r-1", "type": "Restock", "payload": {"sku": "apple", "qty": STOCK}}
        await asyncio.to_thread(shop.command, restock, 2)
        await asyncio.sleep(0.5)  # the stock first, so that how many orders win is known
        for n in range(ORDERS):
            payload = {"order_id": f"o-{n}", "sku": "apple", "qty": 2}
            body = {"id": f"c-{n}", "type": "PlaceOrder", "payload": payload}
            await asyncio.to_thread(shop.command, body, 2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not await asyncio.to_thread(settled):
            await asyncio.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port[0]}/health") as response:
            health.update(json.load(response))
        stop.set()
        await running

    asyncio.run(scenario())
    assert health["ready"] is True, health
    assert set(health["endpoints"]) == {"orders", "inventory"}
    consumed = health["endpoints"]["inventory"]["consumed"][f"rabbitmq:{shop.name}.inventory"]
    assert consumed["duplicates"] > 0 and consumed["rejected"] == 0
    found = shop.orders(ORDERS)
    assert found.pop("pending") == []
    statuses = sorted(state.status for state in found.values())
    assert statuses == ["refused"] * 3 + ["reserved"] * 5
    stock = shop.stock()
    assert stock["pending"] == []
    reserved = stock["apple"].reserved
    assert stock["apple"].available == STOCK - 2 * len(reserved) == 1
    assert sorted(reserved) == sorted(o for o, s in found.items() if s.status == "reserved")
    assert shop.box.depth(f"{shop.name}.orders") == shop.box.depth(f"{shop.name}.inventory") == 0
