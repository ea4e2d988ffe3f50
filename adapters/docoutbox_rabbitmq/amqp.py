"""AMQP details: credential-free URLs, an entry's message properties, and topology."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika  # type: ignore[import-untyped, unused-ignore]

from docoutbox.model import OutboxMessage
from docoutbox_rabbitmq.errors import translated


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``, safe for logs and reprs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def properties_for(entry: OutboxMessage) -> Any:
    """AMQP properties of an entry: persistent JSON, ids, and its stream position in headers.

    The entry's own headers (for example a W3C ``traceparent``) are kept; the names
    ``seq``, ``aggregate_id``, ``aggregate_type`` and ``causation_id`` are reserved.
    """
    headers: dict[str, Any] = dict(entry.headers)
    headers.update(
        seq=entry.seq, aggregate_id=entry.aggregate_id, aggregate_type=entry.aggregate_type
    )
    if entry.causation_id is not None:
        headers["causation_id"] = entry.causation_id
    return pika.BasicProperties(
        content_type="application/json",
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=entry.id,
        type=entry.type,
        timestamp=int(entry.created_at.timestamp()),
        correlation_id=entry.correlation_id,
        headers=headers,
    )


def declare(
    channel: Any,
    exchange: str,
    *,
    exchange_type: str = "topic",
    queues: Mapping[str, Iterable[str]] | None = None,
    dead_letters: str | None = None,
) -> None:
    """Declare a durable exchange and queues bound to it by routing key (idempotent).

    ``queues`` maps a queue name to its binding keys (ignored for the default exchange
    ``""``, which routes by queue name). ``dead_letters`` names a fanout exchange and a
    queue bound to it, set as every declared queue's dead-letter exchange, so messages a
    consumer rejects are kept there instead of being dropped.
    """
    with translated("declare topology"):
        arguments: dict[str, Any] = {}
        if dead_letters:
            channel.exchange_declare(dead_letters, exchange_type="fanout", durable=True)
            channel.queue_declare(dead_letters, durable=True)
            channel.queue_bind(dead_letters, dead_letters)
            arguments["x-dead-letter-exchange"] = dead_letters
        if exchange:
            channel.exchange_declare(exchange, exchange_type=exchange_type, durable=True)
        for queue, keys in (queues or {}).items():
            channel.queue_declare(queue, durable=True, arguments=arguments or None)
            for key in keys if exchange else ():
                channel.queue_bind(queue, exchange, routing_key=key)
