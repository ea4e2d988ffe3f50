"""An order and stock process that runs with no broker: entries move between aggregates
of two collections of one database through :class:`~docoutbox.dispatch.extras.local.LocalPublisher`.

- ``PlaceOrder`` (from outside) on an Order emits ``ReserveStock`` to ``Stock/<sku>`` per
  line;
- a Stock reserves what it has and answers ``StockReserved`` or ``StockRejected`` to
  ``Order/<id>``;
- once every line has answered, the Order is ``confirmed``, or ``rejected`` and it emits
  ``ReleaseStock`` to the stocks that did reserve (compensation).

Each aggregate records the IDs of the messages it handled, so a test can see that every
message took effect exactly once.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from docoutbox import (
    Aggregate,
    AggregateStore,
    Decision,
    Handlers,
    InboxPolicy,
    Message,
    StoreConfig,
    emit,
)
from docoutbox.dispatch.extras.local import LocalPublisher, Route
from docoutbox.ports.store import StoreBackend


class Order(Aggregate):
    aggregate_type: ClassVar[str] = "Order"

    status: str = "new"
    lines: dict[str, int] = Field(default_factory=dict)
    reserved: list[str] = Field(default_factory=list)
    rejected: list[str] = Field(default_factory=list)
    handled: list[str] = Field(default_factory=list)


class Stock(Aggregate):
    aggregate_type: ClassVar[str] = "Stock"

    available: int = 0
    reservations: dict[str, int] = Field(default_factory=dict)
    handled: list[str] = Field(default_factory=list)


order_handlers: Handlers[Order] = Handlers()
stock_handlers: Handlers[Stock] = Handlers()


def _lines(message: Message) -> dict[str, int]:
    raw = message.payload.get("lines")
    if not isinstance(raw, dict):
        raise ValueError("PlaceOrder needs lines: {sku: quantity}")
    return {str(sku): int(qty) for sku, qty in raw.items()}  # type: ignore[arg-type]


@order_handlers.on("PlaceOrder")
def place(order: Order, message: Message) -> Decision[Order]:
    if order.status != "new":
        return Decision(order.model_copy(update={"handled": [*order.handled, message.id]}))
    lines = _lines(message)
    order_id = message.payload["order_id"]
    new = order.model_copy(
        update={"status": "pending", "lines": lines, "handled": [*order.handled, message.id]}
    )
    return Decision(
        new,
        [
            emit(
                "ReserveStock",
                {"order_id": order_id, "sku": sku, "qty": qty},
                destination=f"Stock/{sku}",
            )
            for sku, qty in sorted(lines.items())
        ],
    )


def _answer(order: Order, message: Message, sku: str, ok: bool) -> Decision[Order]:
    reserved = [*order.reserved, sku] if ok else order.reserved
    rejected = order.rejected if ok else [*order.rejected, sku]
    update: dict[str, object] = {
        "reserved": reserved,
        "rejected": rejected,
        "handled": [*order.handled, message.id],
    }
    emits = []
    if len(reserved) + len(rejected) == len(order.lines):
        if rejected:
            update["status"] = "rejected"
            order_id = message.payload["order_id"]
            emits = [
                emit("ReleaseStock", {"order_id": order_id}, destination=f"Stock/{s}")
                for s in sorted(reserved)
            ]
        else:
            update["status"] = "confirmed"
    return Decision(order.model_copy(update=update), emits)


@order_handlers.on("StockReserved")
def reserved(order: Order, message: Message) -> Decision[Order]:
    return _answer(order, message, str(message.payload["sku"]), ok=True)


@order_handlers.on("StockRejected")
def rejected(order: Order, message: Message) -> Decision[Order]:
    return _answer(order, message, str(message.payload["sku"]), ok=False)


@stock_handlers.on("Restock")
def restock(stock: Stock, message: Message) -> Stock:
    qty = message.payload["qty"]
    assert isinstance(qty, int)
    return stock.model_copy(
        update={"available": stock.available + qty, "handled": [*stock.handled, message.id]}
    )


@stock_handlers.on("ReserveStock")
def reserve(stock: Stock, message: Message) -> Decision[Stock]:
    order_id = str(message.payload["order_id"])
    qty = message.payload["qty"]
    assert isinstance(qty, int)
    handled = [*stock.handled, message.id]
    reply = {"order_id": order_id, "sku": message.payload["sku"]}
    if stock.available >= qty:
        new = stock.model_copy(
            update={
                "available": stock.available - qty,
                "reservations": {**stock.reservations, order_id: qty},
                "handled": handled,
            }
        )
        return Decision(new, emit("StockReserved", reply, destination=f"Order/{order_id}"))
    new = stock.model_copy(update={"handled": handled})
    return Decision(new, emit("StockRejected", reply, destination=f"Order/{order_id}"))


@stock_handlers.on("ReleaseStock")
def release(stock: Stock, message: Message) -> Stock:
    order_id = str(message.payload["order_id"])
    reservations = dict(stock.reservations)
    qty = reservations.pop(order_id, 0)
    return stock.model_copy(
        update={
            "available": stock.available + qty,
            "reservations": reservations,
            "handled": [*stock.handled, message.id],
        }
    )


EXACT = StoreConfig(inbox=InboxPolicy(window=100, exact=True))


def stores(
    orders: StoreBackend, stocks: StoreBackend
) -> tuple[AggregateStore[Order], AggregateStore[Stock]]:
    return AggregateStore(orders, Order, EXACT), AggregateStore(stocks, Stock, EXACT)


def publisher(orders: AggregateStore[Order], stocks: AggregateStore[Stock]) -> LocalPublisher:
    """One publisher serves both dispatchers: it routes by the entry's destination."""
    routes = {"Order": Route(orders, order_handlers), "Stock": Route(stocks, stock_handlers)}
    return LocalPublisher(routes)
