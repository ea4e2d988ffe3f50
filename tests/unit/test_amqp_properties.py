"""The asyncio RabbitMQ publisher builds an entry's AMQP properties directly: they are the
properties aio-pika's own ``Message`` would send, for every wire format and entry shape."""

from __future__ import annotations

from datetime import UTC, datetime

import aio_pika
import pytest

from docoutbox import OutboxMessage
from docoutbox.codec import WireFormat
from docoutbox_rabbitmq.aio import amqp_properties
from docoutbox_rabbitmq.amqp import message_for

CREATED = datetime(2026, 11, 27, 12, 30, 5, 123000, tzinfo=UTC)


def entry(**changes: object) -> OutboxMessage:
    fields: dict[str, object] = {
        "id": "e-1",
        "type": "Deposited",
        "payload": {"n": 1, "text": "é"},
        "created_at": CREATED,
        "seq": 7,
        "aggregate_id": "acc-1",
        "aggregate_type": "Account",
    }
    fields.update(changes)
    return OutboxMessage.model_validate(fields)


ENTRIES = [
    entry(),
    entry(correlation_id="corr", causation_id="cause"),
    entry(headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
    entry(aggregate_id=42, seq=1),
]


@pytest.mark.parametrize("wire", list(WireFormat))
@pytest.mark.parametrize("item", ENTRIES)
def test_the_properties_are_those_aio_pika_sends(item: OutboxMessage, wire: WireFormat) -> None:
    body, fields = message_for(item, wire)
    assert amqp_properties(fields) == aio_pika.Message(body, **fields).properties


def test_other_fields_take_aio_pika_s_own_way() -> None:
    body, fields = message_for(entry())
    fields["expiration"] = 60
    fields["app_id"] = "billing"
    properties = amqp_properties(fields)
    assert properties == aio_pika.Message(body, **fields).properties
    assert properties.app_id == "billing"
