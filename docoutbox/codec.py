"""The broker body of an outbox entry, shared by every broker adapter."""

from __future__ import annotations

import json
from typing import Any

from docoutbox.errors import InvalidMessage
from docoutbox.model import Message, OutboxMessage

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


def decode_message(body: bytes | str) -> Message:
    """The message in a broker body: a docoutbox entry (:func:`encode_entry`, recognised by
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
