"""The wire formats: plain docoutbox JSON and CloudEvents (structured, binary), and the
JSON Schemas shipped with the package."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from benchmarks.ledger import make_entry
from docoutbox.codec import (
    AMQP_PREFIX,
    KAFKA_PREFIX,
    WireFormat,
    cloudevent,
    decode_message,
    encode,
    encode_entry,
    schema,
)
from docoutbox.errors import InvalidInput, InvalidMessage

CHECKER = jsonschema.FormatChecker()


def entry(**fields: Any) -> Any:
    return make_entry(
        "acc 1/x",
        7,
        headers={"traceparent": "00-abc-def-01", "X-Tenant": "t1"},
        correlation_id="corr-1",
        causation_id="cause-1",
        **fields,
    )


def as_event(wire: WireFormat, body: bytes, attributes: dict[str, Any]) -> dict[str, Any]:
    """The CloudEvent a consumer reconstructs from what it received."""
    if wire is WireFormat.STRUCTURED:
        parsed: dict[str, Any] = json.loads(body)
        return parsed
    return {**attributes, "datacontenttype": "application/json", "data": json.loads(body)}


@pytest.mark.parametrize("wire", list(WireFormat))
@pytest.mark.parametrize("prefix", [KAFKA_PREFIX, AMQP_PREFIX, "ce-"])
def test_every_wire_format_decodes_to_the_same_message(wire: WireFormat, prefix: str) -> None:
    sent = entry()
    encoded = encode(sent, wire)
    received = decode_message(encoded.body, encoded.headers(prefix), encoded.content_type)
    assert received == sent.to_message()
    assert received.source == "Producer/acc 1/x" and received.seq == 7


def test_plain_is_the_encoded_entry_and_matches_the_entry_schema() -> None:
    sent = entry(destination="orders")
    encoded = encode(sent)
    assert encoded.body == encode_entry(sent) and encoded.attributes == {}
    assert encoded.content_type == "application/json"
    jsonschema.validate(json.loads(encoded.body), schema("entry"), format_checker=CHECKER)


@pytest.mark.parametrize("wire", [WireFormat.STRUCTURED, WireFormat.BINARY])
def test_cloudevents_match_the_cloudevent_schema(wire: WireFormat) -> None:
    encoded = encode(entry(), wire)
    event = as_event(wire, encoded.body, encoded.attributes)
    jsonschema.validate(event, schema("cloudevent"), format_checker=CHECKER)
    assert event["source"] == "/Producer/acc%201%2Fx"
    assert event["subject"] == "acc 1/x" and event["seq"] == 7
    assert event["traceparent"] == "00-abc-def-01"
    assert json.loads(event["xheaders"]) == {"X-Tenant": "t1"}
    assert event["time"].endswith("Z")


def test_binary_mode_puts_attributes_in_headers_and_the_payload_in_the_body() -> None:
    encoded = encode(entry(), WireFormat.BINARY)
    assert json.loads(encoded.body) == {"n": 1}
    headers = encoded.headers(KAFKA_PREFIX)
    assert headers["ce_specversion"] == "1.0" and headers["ce_type"] == "Event"
    assert "ce_datacontenttype" not in headers and "ce_data" not in headers
    assert encode(entry(), WireFormat.STRUCTURED).content_type == "application/cloudevents+json"


def test_schemas_reject_what_is_not_a_message() -> None:
    body = json.loads(encode_entry(entry()))
    for broken in ({**body, "seq": 0}, {k: v for k, v in body.items() if k != "id"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema("entry"), format_checker=CHECKER)
    event = cloudevent(entry())
    for broken in ({**event, "specversion": "0.3"}, {**event, "Bad-Name": "x"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema("cloudevent"), format_checker=CHECKER)


def test_a_foreign_cloudevent_is_a_message_without_stream_position() -> None:
    event = {
        "specversion": "1.0",
        "id": "ev-1",
        "source": "https://example.com/orders",
        "type": "OrderPlaced",
        "data": {"total": 3},
        "tenant": "t1",
    }
    message = decode_message(json.dumps(event).encode(), None, "application/cloudevents+json")
    assert (message.id, message.type, message.payload) == ("ev-1", "OrderPlaced", {"total": 3})
    assert message.headers == {"tenant": "t1"}
    assert message.source is None and message.seq is None


@pytest.mark.parametrize(
    ("body", "headers", "content_type"),
    [
        (b'{"specversion": "0.3", "id": "a", "type": "t", "source": "s"}', None, None),
        (b'{"specversion": "1.0", "type": "t", "source": "s"}', None, None),
        (b'{"specversion": "1.0", "id": "a", "type": "t", "source": "s", "data": [1]}', None, None),
        (b"[1, 2]", None, "application/cloudevents+json"),
        (b"not json", {"ce_specversion": b"1.0", "ce_id": b"a"}, None),
        (b"{}", {"ce_specversion": b"1.0", "ce_id": b"a", "ce_type": b"t"}, None),
        (
            b"{}",
            {
                **{f"ce_{k}": v for k, v in (("specversion", "1.0"), ("id", "a"))},
                **{"ce_type": "t", "ce_source": "s", "ce_seq": "x"},
                **{"ce_aggregatetype": "P", "ce_aggregateid": "1"},
            },
            None,
        ),
        (b"not json", None, None),
    ],
)
def test_malformed_input_is_an_invalid_message(
    body: bytes, headers: Any, content_type: str | None
) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(body, headers, content_type)


def test_schemas_are_package_data() -> None:
    assert schema("entry")["title"] == "docoutbox outbox entry"
    assert schema("cloudevent")["properties"]["specversion"] == {"const": "1.0"}


def test_an_unknown_wire_format_is_a_typed_error() -> None:
    with pytest.raises(InvalidInput, match="unknown wire format 'xml'"):
        encode(entry(), "xml")  # type: ignore[arg-type]
    assert WireFormat("binary") is WireFormat.BINARY
