"""The broker body of an outbox entry, shared by every broker adapter."""

from __future__ import annotations

import json

from docoutbox.errors import InvalidMessage
from docoutbox.model import OutboxMessage


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
