"""The broker body of an outbox entry, shared by every broker adapter.

Plain docoutbox JSON, or a CloudEvent in structured or binary mode (:class:`WireFormat`);
:func:`decode_message` reads all three, and plain ``{id, type, payload}`` messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC
from enum import StrEnum
from importlib import resources
from typing import Any
from urllib.parse import quote

from docoutbox.errors import InvalidInput, InvalidMessage
from docoutbox.model import Message, OutboxMessage, stream_name

#: The fields a plain message from a producer that is not docoutbox may carry.
PLAIN_FIELDS = ("id", "type", "payload", "headers", "correlation_id", "causation_id")


def encode_entry(entry: OutboxMessage) -> bytes:
    """The broker body for an entry: compact JSON of the whole entry."""
    return entry.model_dump_json().encode()


def decode_entry(body: bytes | str) -> OutboxMessage:
    """Parse a broker body written by :func:`encode_entry`; typed error if malformed."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"body is not JSON: {exc}") from exc
    parsed: OutboxMessage = OutboxMessage.parse(data)
    return parsed


def _plain_message(body: bytes | str) -> Message:
    """The message in a plain broker body: a docoutbox entry (:func:`encode_entry`, recognised by
    its ``seq`` and ``aggregate_id``), or a plain ``{id, type, payload}`` object from any
    other producer (also ``headers``, ``correlation_id``, ``causation_id``; other fields
    are ignored). Typed error if neither."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidMessage(f"body is not a JSON object: {type(data).__name__}")
    if "seq" in data and "aggregate_id" in data:
        entry: OutboxMessage = OutboxMessage.parse(data)
        return entry.to_message()
    message: Message = Message.parse({k: data[k] for k in PLAIN_FIELDS if k in data})
    return message


# --- Wire formats -------------------------------------------------------------------------
#
# Rule: one mapping between an entry and what a broker carries, for every broker adapter.
# Adapters only choose where the pieces go (AMQP properties and headers, Kafka headers).


class WireFormat(StrEnum):
    """How an entry travels: docoutbox's own JSON body, or a CloudEvent (1.0)."""

    #: The body is :func:`encode_entry` (JSON Schema: ``docoutbox/schema/entry.schema.json``).
    PLAIN = "plain"
    #: CloudEvents structured mode: the body is the event as JSON
    #: (``application/cloudevents+json``; ``docoutbox/schema/cloudevent.schema.json``).
    STRUCTURED = "structured"
    #: CloudEvents binary mode: the body is the payload; the attributes travel as headers
    #: (``ce_`` on Kafka, ``cloudEvents:`` on AMQP).
    BINARY = "binary"

    @classmethod
    def _missing_(cls, value: object) -> WireFormat:
        choices = ", ".join(repr(str(member)) for member in cls)
        raise InvalidInput(f"unknown wire format {value!r}; choose one of {choices}")


SPECVERSION = "1.0"
CLOUDEVENTS_JSON = "application/cloudevents+json"
JSON = "application/json"
#: Header prefixes of CloudEvents attributes in binary mode, per protocol binding.
KAFKA_PREFIX = "ce_"
AMQP_PREFIX = "cloudEvents:"
#: Prefixes accepted when reading (the bindings' current and older spellings, and HTTP's).
_PREFIXES = ("ce_", "ce-", "cloudEvents:", "cloudEvents_", "cloudevents:", "cloudevents_")
#: CloudEvents context attributes, and the extensions docoutbox defines.
_CONTEXT = frozenset({"specversion", "id", "source", "type", "time", "subject", "datacontenttype"})
_OWN = frozenset(
    {"aggregatetype", "aggregateid", "seq", "correlationid", "causationid", "xheaders"}
)
_ATTRIBUTE_NAME = re.compile(r"[a-z0-9]{1,20}")


def cloudevent(entry: OutboxMessage) -> dict[str, Any]:
    """The entry as a CloudEvent: its attributes and ``data`` (the payload).

    ``id``, ``type`` and ``time`` (``created_at``) are the entry's; ``source`` is
    ``/<aggregate_type>/<aggregate_id>`` and ``subject`` the aggregate ID; the extensions
    ``aggregatetype``, ``aggregateid`` and ``seq`` (Integer) carry the stream position that
    exact de-duplication needs, ``correlationid`` and ``causationid`` the ids when set.
    Each entry header whose name is a valid attribute name (``[a-z0-9]{1,20}``, for
    example ``traceparent``) becomes an extension; the others travel as JSON in
    ``xheaders``.
    """
    event: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": entry.id,
        "source": f"/{_segment(entry.aggregate_type)}/{_segment(entry.aggregate_id)}",
        "type": entry.type,
        "time": entry.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "subject": str(entry.aggregate_id),
        "datacontenttype": JSON,
        "aggregatetype": entry.aggregate_type,
        "aggregateid": str(entry.aggregate_id),
        "seq": entry.seq,
    }
    if entry.correlation_id is not None:
        event["correlationid"] = entry.correlation_id
    if entry.causation_id is not None:
        event["causationid"] = entry.causation_id
    other: dict[str, str] = {}
    for name, value in entry.headers.items():
        reserved = name in _CONTEXT or name in _OWN or name == "data"
        if _ATTRIBUTE_NAME.fullmatch(name) and not reserved:
            event[name] = value
        else:
            other[name] = value
    if other:
        event["xheaders"] = json.dumps(other, separators=(",", ":"), sort_keys=True)
    event["data"] = entry.payload
    return event


@dataclass(frozen=True)
class Encoded:
    """What a publisher sends for one entry: a body, its content type, and (binary mode)
    the CloudEvents attributes to put in headers, without the binding's prefix."""

    body: bytes
    content_type: str
    attributes: dict[str, str | int] = field(default_factory=dict)

    def headers(self, prefix: str) -> dict[str, str | int]:
        return {prefix + name: value for name, value in self.attributes.items()}


def encode(entry: OutboxMessage, wire: WireFormat = WireFormat.PLAIN) -> Encoded:
    """The body (and, in binary mode, the attributes) of an entry in ``wire`` format."""
    wire = WireFormat(wire)
    if wire is WireFormat.PLAIN:
        return Encoded(encode_entry(entry), JSON)
    event = cloudevent(entry)
    if wire is WireFormat.STRUCTURED:
        return Encoded(_dumps(event), CLOUDEVENTS_JSON)
    data = event.pop("data")
    event.pop("datacontenttype")
    return Encoded(_dumps(data), JSON, event)


def decode_message(
    body: bytes | str,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
) -> Message:
    """The message a received body carries, whatever the wire format.

    - a CloudEvent in structured mode (``application/cloudevents+json``, or a JSON object
      with ``specversion``);
    - a CloudEvent in binary mode (``ce_``/``cloudEvents:`` headers with ``specversion``);
    - else a docoutbox entry (:func:`encode_entry`) or a plain ``{id, type, payload}``
      object from any other producer.

    A CloudEvent with docoutbox's extensions gives the same message as the plain body of
    the same entry (``source`` and ``seq`` included, for exact de-duplication); any other
    CloudEvent gives a message without them. Raises ``InvalidMessage`` if malformed.
    """
    attributes = _binary_attributes(headers or {})
    if "specversion" in attributes:
        try:
            data = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidMessage(f"CloudEvent data is not JSON: {exc}") from exc
        return _message_of({**attributes, "data": data})
    structured = (content_type or "").split(";")[0].strip().lower() == CLOUDEVENTS_JSON
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"body is not JSON: {exc}") from exc
    if isinstance(parsed, dict) and (structured or "specversion" in parsed):
        return _message_of(parsed)
    return _plain_message(body)


def _binary_attributes(headers: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for key, value in headers.items():
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                text = value.decode() if isinstance(value, bytes) else value
                attributes[key[len(prefix) :].lower()] = text
                break
    return attributes


def _message_of(event: Mapping[str, Any]) -> Message:
    if event.get("specversion") != SPECVERSION:
        raise InvalidMessage(f"unsupported CloudEvents specversion {event.get('specversion')!r}")
    for name in ("id", "type", "source"):
        if not isinstance(event.get(name), str) or not event[name]:
            raise InvalidMessage(f"CloudEvent without a valid {name!r}")
    data = event.get("data", {})
    if not isinstance(data, dict):
        raise InvalidMessage("CloudEvent data must be a JSON object")
    headers = {
        str(k): str(v)
        for k, v in event.items()
        if k not in _CONTEXT and k not in _OWN and k not in ("data", "data_base64")
    }
    extra = event.get("xheaders")
    if extra is not None:
        try:
            more = json.loads(extra)
        except (ValueError, TypeError) as exc:
            raise InvalidMessage(f"CloudEvent xheaders is not JSON: {exc}") from exc
        if not isinstance(more, dict):
            raise InvalidMessage("CloudEvent xheaders must be a JSON object")
        headers.update({str(k): str(v) for k, v in more.items()})
    source: str | None = None
    seq: int | None = None
    if "seq" in event and "aggregatetype" in event and "aggregateid" in event:
        try:
            seq = int(event["seq"])
        except (TypeError, ValueError) as exc:
            raise InvalidMessage(f"CloudEvent seq is not an integer: {event['seq']!r}") from exc
        source = stream_name(str(event["aggregatetype"]), str(event["aggregateid"]))
    message: Message = Message.parse(
        {
            "id": event["id"],
            "type": event["type"],
            "payload": data,
            "headers": headers,
            "correlation_id": event.get("correlationid"),
            "causation_id": event.get("causationid"),
            "source": source,
            "seq": seq,
        }
    )
    return message


def _segment(value: object) -> str:
    return quote(str(value), safe="")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def schema(name: str = "entry") -> dict[str, Any]:
    """A JSON Schema shipped with the package: ``entry`` (the plain body) or ``cloudevent``
    (the structured CloudEvent, docoutbox's extensions included)."""
    text = resources.files("docoutbox").joinpath(f"schema/{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded
