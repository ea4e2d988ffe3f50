"""The Order and Inventory endpoints in memory (docoutbox_app.testing.TestBus): no broker,
no database; redelivered commands and duplicated deliveries change nothing twice."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox_app.endpoint import Endpoint
from docoutbox_app.testing import TestBus
from examples.order_inventory import cosmos, mongo

NOON = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def place(command_id: str, order_id: str, sku: str = "apple", qty: int = 2) -> dict[str, Any]:
    return {
        "id": command_id,
        "type": "PlaceOrder",
        "payload": {"order_id": order_id, "sku": sku, "qty": qty},
    }


def restock(command_id: str, sku: str, qty: int) -> dict[str, Any]:
    return {"id": command_id, "type": "Restock", "payload": {"sku": sku, "qty": qty}}


@pytest.fixture(params=[mongo, cosmos], ids=["mongo", "cosmos"])
def bus(request: pytest.FixtureRequest) -> TestBus:
    endpoints: list[Endpoint[Any]] = [request.param.orders, request.param.inventory]
    return TestBus(*endpoints, clock=lambda: NOON)


def test_an_order_reserves_stock_and_inventory_replies(bus: TestBus) -> None:
    bus.send("inventory", restock("r-1", "apple", 5))
    bus.send("orders", place("c-1", "o-1"))
    bus.run()
    order = bus.state("orders", "o-1")
    assert (order.status, order.placed_at) == ("reserved", NOON.isoformat())
    assert bus.state("inventory", "apple").available == 3
    assert bus.types() == ["ReserveStock", "StockReserved"]
    assert bus.outbox("orders") == bus.outbox("inventory") == []


def test_without_stock_the_order_is_refused(bus: TestBus) -> None:
    bus.send("orders", place("c-1", "o-1", sku="pear"))
    bus.run()
    assert bus.state("orders", "o-1").status == "refused"
    assert bus.state("inventory", "pear").available == 0


def test_redelivered_commands_and_duplicated_deliveries_apply_once(bus: TestBus) -> None:
    assert [d.action for d in bus.send("inventory", restock("r-1", "apple", 5), times=3)] == [
        "ack"
    ] * 3
    for n in range(3):
        bus.send("orders", place(f"c-{n}", f"o-{n}"), times=2)  # each command twice
    deliveries = bus.run(duplicates=2)  # the broker delivers everything twice
    assert sum(d.verdict.outcome is not None and d.verdict.outcome.duplicate for d in deliveries)
    assert [bus.state("orders", f"o-{n}").status for n in range(3)] == ["reserved"] * 2 + [
        "refused"
    ]
    stock = bus.state("inventory", "apple")
    assert (stock.available, stock.reserved) == (1, {"o-0": 2, "o-1": 2})
    assert sorted(bus.types()) == ["ReserveStock"] * 3 + ["StockRefused"] + ["StockReserved"] * 2
    assert bus.outbox("orders") == bus.outbox("inventory") == []
    assert bus.rejected("orders") == bus.rejected("inventory") == []


def test_a_reply_for_an_unknown_order_is_rejected_not_created(bus: TestBus) -> None:
    reply = {"order_id": "nobody", "sku": "apple", "qty": 1}
    [delivered] = bus.send("orders", {"id": "x-1", "type": "StockReserved", "payload": reply})
    assert delivered.action == "reject"
    assert bus.state("orders", "nobody") is None
    assert len(bus.rejected("orders")) == 1
