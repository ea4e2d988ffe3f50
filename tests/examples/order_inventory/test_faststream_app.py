"""The Inventory service as a FastStream app beside the Orders endpoint, on RabbitMQ and
the MongoDB wire server: commands sent twice, and still every reservation once, every
order settled, every outbox empty."""

from __future__ import annotations

import asyncio
import runpy
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("faststream")

from faststream import TestApp

from docoutbox_app.endpoint import Endpoint, serve
from tests.examples.order_inventory.conftest import Shop

pytestmark = pytest.mark.rabbitmq

HERE = Path(__file__).resolve().parents[3] / "examples" / "order_inventory"
ORDERS = 6


@pytest.mark.parametrize("shop", ["mongo"], indirect=True)
def test_the_faststream_inventory_with_the_orders_endpoint(shop: Shop) -> None:
    inventory = runpy.run_path(str(HERE / "faststream_inventory.py"))  # this test's SHOP
    orders: Endpoint[Any] = runpy.run_path(str(HERE / "mongo.py"))["orders"]

    async def scenario() -> None:
        stop = asyncio.Event()
        async with TestApp(inventory["app"]):
            running = asyncio.create_task(serve([orders], stop))
            restock = {"id": "r-1", "type": "Restock", "payload": {"sku": "apple", "qty": 4}}
            await asyncio.to_thread(shop.command, restock, 2)
            await asyncio.sleep(0.5)
            for n in range(ORDERS):
                payload = {"order_id": f"o-{n}", "sku": "apple", "qty": 1}
                body = {"id": f"c-{n}", "type": "PlaceOrder", "payload": payload}
                await asyncio.to_thread(shop.command, body, 2)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                found = await asyncio.to_thread(shop.orders, ORDERS)
                settled = [k for k, s in found.items() if k != "pending" and s.status != "pending"]
                if len(settled) == ORDERS and not found["pending"]:
                    break
                await asyncio.sleep(0.2)
            stop.set()
            await running

    asyncio.run(scenario())
    found = shop.orders(ORDERS)
    assert found.pop("pending") == []
    assert sorted(s.status for s in found.values()) == ["refused"] * 2 + ["reserved"] * 4
    stock = shop.stock()
    assert stock["pending"] == []
    assert stock["apple"].available == 0 and len(stock["apple"].reserved) == 4
    assert shop.box.depth(f"{shop.name}.orders") == shop.box.depth(f"{shop.name}.inventory") == 0
