"""The asyncio RabbitMQ publisher builds an entry's AMQP properties and frames directly: they
are the properties aio-pika's own ``Message`` would send, and the bytes pamqp would marshal,
for every wire format and entry shape."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import aio_pika
import pytest
from pamqp import encode
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.frame import marshal
from pamqp.header import ContentHeader

from docoutbox import OutboxMessage
from docoutbox.codec import WireFormat
from docoutbox.errors import PermanentPublishError
from docoutbox_rabbitmq import frames
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


def pamqp_frames(
    channel: int, routing_key: str, properties: Basic.Properties, body: bytes, max_content: int
) -> bytes:
    """What aiormq's ``basic_publish`` writes: pamqp's marshalling of each frame."""
    method = Basic.Publish(exchange="ex", routing_key=routing_key, mandatory=True)
    data = marshal(method, channel) + marshal(ContentHeader(0, len(body), properties), channel)
    for start in range(0, len(body), max_content):
        data += marshal(ContentBody(body[start : start + max_content]), channel)
    return data


@pytest.mark.parametrize("wire", list(WireFormat))
@pytest.mark.parametrize("item", ENTRIES)
def test_a_publish_s_frames_are_the_bytes_pamqp_marshals(
    item: OutboxMessage, wire: WireFormat
) -> None:
    body, fields = message_for(item, wire)
    expected = pamqp_frames(7, "acc.key", amqp_properties(fields), body, 4088)
    ex = frames.short_string("ex", "exchange")
    key = frames.short_string("acc.key", "routing key")
    assert frames.publish(7, ex, key, True, frames.properties(fields), body, 4088) == expected


@pytest.mark.parametrize("size", [0, 1, 99, 100, 101, 250, 300])
def test_a_body_over_frame_max_goes_in_frames_of_at_most_frame_max(size: int) -> None:
    body, fields = message_for(entry())
    body = bytes(range(100)) * 3
    body = body[:size]
    data = frames.publish(1, b"\x02ex", b"\x01k", True, frames.properties(fields), body, 100)
    assert data == pamqp_frames(1, "k", amqp_properties(fields), body, 100)
    # the body frames: type 3, each payload at most 100 bytes, together the body
    header_end = data.index(b"\xce\x02") + 1
    rest, chunks = data[header_end:], []
    rest = rest[rest.index(b"\xce") + 1 :]  # past the content header
    while rest:
        kind, _, length = struct.unpack(">BHI", rest[:7])
        assert kind == 3 and length <= 100
        chunks.append(rest[7 : 7 + length])
        assert rest[7 + length] == 0xCE
        rest = rest[8 + length :]
    assert b"".join(chunks) == body
    assert len(chunks) == -(-size // 100)


def test_a_value_amqp_cannot_carry_is_refused_before_sending() -> None:
    _, fields = message_for(entry(id="x" * 300))
    with pytest.raises(PermanentPublishError, match="message_id is 300 bytes"):
        frames.properties(fields)
    with pytest.raises(PermanentPublishError, match="routing key"):
        frames.short_string("k" * 256, "routing key")
    _, fields = message_for(entry())
    fields["headers"] = {"bad": object()}
    with pytest.raises(PermanentPublishError, match="AMQP table"):
        frames.properties(fields)


#: Every integer type boundary pamqp distinguishes, and either side of it.
BOUNDARIES = [
    edge + step
    for edge in (-(2**63), -(2**31), -32768, -128, 0, 127, 32767, 65535, 2**31 - 1, 2**32 - 1)
    for step in (-1, 0, 1)
] + [2**63 - 1]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"seq": 1, "aggregate_id": "a-1", "aggregate_type": "Order"},
        {"z": "last", "a": "first", "m": "ünïcödé ✓", "empty": ""},
        *({"n": n, "s": str(n)} for n in BOUNDARIES),
        {"big": 2**63},  # pamqp refuses it: so does the table
        {"flag": True, "seq": 3},  # bool: pamqp's way
        {"nested": {"seq": 1}, "list": [1, "a"], "none": None, "f": 1.5},
        {"k" * 129: "a key pamqp truncates"},
    ],
)
def test_a_field_table_is_the_bytes_pamqp_encodes(values: dict[str, object]) -> None:
    try:
        expected = encode.field_table(values)
    except TypeError:
        with pytest.raises(TypeError):
            frames.table(values)
        return
    assert frames.table(values) == expected
