"""Kafka record details: an entry's headers, and configuration safe to log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from docoutbox.codec import KAFKA_PREFIX, WireFormat, encode, encode_entry
from docoutbox.errors import InvalidConfig
from docoutbox.model import OutboxMessage

#: Configuration keys whose values are secrets.
SECRET_KEYS = ("password", "secret", "token", "jaas")


#: Record headers as confluent-kafka takes them.
Headers = list[tuple[str, str | bytes | None]]


def headers_for(entry: OutboxMessage) -> Headers:
    """An entry's record headers: its own headers, then its identity and stream position.

    The names ``id``, ``type``, ``seq``, ``aggregate_id``, ``aggregate_type``,
    ``correlation_id``, ``causation_id`` and ``content-type`` are reserved. Values are
    UTF-8 text.
    """
    fields: dict[str, str] = dict(entry.headers)
    fields.update(
        {
            "content-type": "application/json",
            "id": entry.id,
            "type": entry.type,
            "seq": str(entry.seq),
            "aggregate_id": str(entry.aggregate_id),
            "aggregate_type": entry.aggregate_type,
        }
    )
    if entry.correlation_id is not None:
        fields["correlation_id"] = entry.correlation_id
    if entry.causation_id is not None:
        fields["causation_id"] = entry.causation_id
    return [(name, value.encode()) for name, value in fields.items()]


def record_for(entry: OutboxMessage, wire: WireFormat = WireFormat.PLAIN) -> tuple[bytes, Headers]:
    """An entry's record value and headers in ``wire`` format.

    Plain: :func:`~docoutbox.codec.encode_entry` with :func:`headers_for`. CloudEvents
    structured: the event as the value, ``content-type: application/cloudevents+json``.
    CloudEvents binary: the payload as the value, the attributes as ``ce_`` headers (the
    Kafka binding) and ``content-type: application/json``.
    """
    if wire is WireFormat.PLAIN:
        return encode_entry(entry), headers_for(entry)
    encoded = encode(entry, wire)
    headers: Headers = [("content-type", encoded.content_type.encode())]
    headers += [
        (name, str(value).encode()) for name, value in encoded.headers(KAFKA_PREFIX).items()
    ]
    return encoded.body, headers


#: Record headers as confluent-kafka may return them.
ReceivedHeaders = Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]] | None


def received_headers(record_headers: ReceivedHeaders) -> dict[str, str]:
    """A record's headers as text (the last value of a repeated name wins)."""
    pairs = record_headers.items() if isinstance(record_headers, Mapping) else record_headers
    return {
        name: value.decode(errors="replace") if isinstance(value, bytes) else (value or "")
        for name, value in pairs or []
    }


def masked_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secret values replaced by ``***``, safe for logs and reprs."""
    return {
        key: "***" if any(word in key.lower() for word in SECRET_KEYS) else value
        for key, value in config.items()
    }


def client_settings(config: object) -> dict[str, Any]:
    """The librdkafka settings of ``config``: bootstrap servers as a non-empty string, or
    a mapping of settings. InvalidConfig otherwise (None raised a TypeError, and an empty
    string was accepted until the first publish timed out)."""
    if isinstance(config, str):
        if not config.strip():
            raise InvalidConfig("the Kafka bootstrap servers must not be empty")
        return {"bootstrap.servers": config}
    if not isinstance(config, Mapping):
        raise InvalidConfig(
            f"Kafka config must be bootstrap servers (a str) or a mapping of settings, "
            f"got {type(config).__name__}"
        )
    return dict(config)
