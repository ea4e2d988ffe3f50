"""TestBus and scheduled messages: published once the bus's clock reaches their due time,
never when cancelled first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from docoutbox import Aggregate, Decision, Handlers, Message, emit
from docoutbox.model import cancel
from docoutbox_app.endpoint import Broker, Endpoint, RabbitQueue, Store, payload_field
from docoutbox_app.testing import TestBus

NOON = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


class Payment(Aggregate):
    paid: bool = False


payments: Handlers[Payment] = Handlers()


@payments.on("Await")
def wait(state: Payment, message: Message) -> Decision[Payment]:
    return Decision(state, emit("TimedOut", deliver_after=timedelta(minutes=5), key="t"))


@payments.on("Pay")
def pay(state: Payment, message: Message) -> Decision[Payment]:
    return Decision(state.model_copy(update={"paid": True}), cancel("t"), emit("Paid"))


endpoint = Endpoint(
    "payments",
    Payment,
    payments,
    store=Store("mongo", "mongodb://127.0.0.1:1", "shop", "payments"),
    inputs=[
        RabbitQueue(
            queue="payments", url="amqp://127.0.0.1:1", route=payload_field("id"), creates={"Await"}
        )
    ],
    output=Broker("rabbitmq", "amqp://127.0.0.1:1", destination="shop"),
)


def command(message_id: str, kind: str, payment: str) -> dict[str, object]:
    return {"id": message_id, "type": kind, "payload": {"id": payment}}


def test_a_scheduled_message_waits_for_the_bus_clock_and_a_cancel_drops_it() -> None:
    now = [NOON]
    bus = TestBus(endpoint, clock=lambda: now[0])
    bus.send("payments", command("c-1", "Await", "p-1"))
    bus.send("payments", command("c-2", "Await", "p-2"))
    bus.send("payments", command("c-3", "Pay", "p-2"))
    bus.run()
    assert bus.types() == ["Paid"]
    assert [e.type for e in bus.outbox("payments")] == ["TimedOut"]  # p-1's, not yet due
    now[0] = NOON + timedelta(minutes=5)
    bus.run()
    assert bus.types() == ["Paid", "TimedOut"]
    assert bus.outbox("payments") == []
