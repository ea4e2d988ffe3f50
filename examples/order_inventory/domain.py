"""Orders and stock: aggregates and pure handlers, the same on every database.

An order reserves stock; inventory replies StockReserved or StockRefused.
"""

from __future__ import annotations

from pydantic import Field

from docoutbox import Aggregate, Context, Decision, Handlers, Message, emit


class Order(Aggregate):
    sku: str = ""
    qty: int = 0
    status: str = "new"
    placed_at: str = ""


class Stock(Aggregate):
    available: int = 0
    reserved: dict[str, int] = Field(default_factory=dict)


orders: Handlers[Order] = Handlers()
inventory: Handlers[Stock] = Handlers()


@orders.on("PlaceOrder")
def place(order: Order, message: Message, context: Context) -> Decision[Order]:
    if order.status != "new":
        return Decision(order)  # the same order placed twice under another ID
    sku, qty = str(message.payload["sku"]), int(message.payload["qty"])
    placed = Order(sku=sku, qty=qty, status="pending", placed_at=context.now.isoformat())
    reserve = {"order_id": context.aggregate_id, "sku": sku, "qty": qty}
    return Decision(placed, emit("ReserveStock", reserve))


@orders.on("StockReserved", "StockRefused")
def settle(order: Order, message: Message) -> Order:
    status = "reserved" if message.type == "StockReserved" else "refused"
    return order.model_copy(update={"status": status})


@inventory.on("Restock")
def restock(stock: Stock, message: Message) -> Stock:
    return stock.model_copy(update={"available": stock.available + int(message.payload["qty"])})


@inventory.on("ReserveStock")
def reserve(stock: Stock, message: Message) -> Decision[Stock]:
    order_id, qty = str(message.payload["order_id"]), int(message.payload["qty"])
    reply = {"order_id": order_id, "sku": message.payload["sku"], "qty": qty}
    if stock.available < qty:
        return Decision(stock, emit("StockRefused", reply))
    left = stock.model_copy(
        update={"available": stock.available - qty, "reserved": {**stock.reserved, order_id: qty}}
    )
    return Decision(left, emit("StockReserved", reply))
