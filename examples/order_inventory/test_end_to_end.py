"""The Order and Inventory endpoints end to end on the MongoDB wire server and RabbitMQ:
commands published twice (redelivered), every outbox entry published twice (a broker that
duplicates), and still every effect exactly once, every outbox empty at the end, and a
clean shutdown that releases the dispatchers' leases."""

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
from examples.order_inventory.conftest import command, documents
from tests.support.e2e import Sandbox

pytestmark = pytest.mark.rabbitmq

HERE = Path(__file__).parent
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


def test_orders_and_inventory_exactly_once_end_to_end(
    shop: tuple[str, str, Sandbox], mongo_uri: str
) -> None:
    name, url, box = shop
    module = runpy.run_path(str(HERE / "mongo.py"))  # read with this test's SHOP
    orders: Endpoint[Any] = module["orders"]
    inventory: Endpoint[Any] = module["inventory"]
    for endpoint in (orders, inventory):
        endpoint.output = Twice(RabbitPublisher(url, exchange=name))
    health: dict[str, Any] = {}

    def settled() -> bool:
        docs = documents(mongo_uri, name, "orders")
        done = [d for d in docs if d["state"]["status"] in ("reserved", "refused")]
        stock = documents(mongo_uri, name, "stock")
        empty = all(not d.get("outbox") for d in docs + stock)
        return len(done) == ORDERS and empty

    async def scenario() -> None:
        stop = asyncio.Event()
        port: list[int] = []
        running = asyncio.create_task(
            serve([orders, inventory], stop, health_port=0, serving=port.append)
        )
        await asyncio.to_thread(
            command,
            url,
            name,
            {"id": "r-1", "type": "Restock", "payload": {"sku": "apple", "qty": STOCK}},
            2,
        )
        await asyncio.sleep(0.5)  # the stock first, so that which orders win is known
        for n in range(ORDERS):
            payload = {"order_id": f"o-{n}", "sku": "apple", "qty": 2}
            body = {"id": f"c-{n}", "type": "PlaceOrder", "payload": payload}
            await asyncio.to_thread(command, url, name, body, 2)
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
    consumed = health["endpoints"]["inventory"]["consumed"][f"rabbitmq:{name}.inventory"]
    assert consumed["duplicates"] > 0 and consumed["rejected"] == 0
    by_id = {d["_id"]: d["state"] for d in documents(mongo_uri, name, "orders")}
    statuses = sorted(state["status"] for state in by_id.values())
    assert statuses == ["refused"] * 3 + ["reserved"] * 5
    [stock] = documents(mongo_uri, name, "stock")
    reserved = stock["state"]["reserved"]
    assert stock["state"]["available"] == STOCK - 2 * len(reserved) == 1
    assert sorted(reserved) == sorted(o for o, s in by_id.items() if s["status"] == "reserved")
    for doc in [*documents(mongo_uri, name, "orders"), stock]:
        assert doc.get("outbox") == []
    assert box.depth(f"{name}.orders") == box.depth(f"{name}.inventory") == 0
