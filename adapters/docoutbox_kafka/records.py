"""Kafka record details: an entry's headers, and configuration safe to log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def masked_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secret values replaced by ``***``, safe for logs and reprs."""
    return {
        key: "***" if any(word in key.lower() for word in SECRET_KEYS) else value
        for key, value in config.items()
    }
