"""AMQP details: credential-free URLs, an entry's message properties, and topology."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika  # type: ignore[import-untyped, unused-ignore]

from docoutbox.codec import AMQP_PREFIX, WireFormat, encode
from docoutbox.errors import InvalidConfig, PermanentPublishError
from docoutbox.model import OutboxMessage
from docoutbox_rabbitmq.errors import translated


def check_url(url: object) -> str:
    """``url`` if it is an ``amqp://`` or ``amqps://`` URL (no host: localhost), else InvalidConfig
    (pika raised IndexError or TypeError for some malformed URLs, or accepted them)."""
    # pika's own parameters are checked by pika_parameters (aio-pika takes others).
    if not isinstance(url, str):
        raise InvalidConfig(f"the broker URL must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
        if parts.scheme not in {"amqp", "amqps"}:
            raise ValueError(f"expected amqp:// or amqps://, got {masked(url)!r}")
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise InvalidConfig(f"not a usable AMQP URL: {exc}") from None
    return url


def pika_parameters(url: str) -> Any:
    """pika's connection parameters for ``url``; InvalidConfig for one pika refuses."""
    try:
        return pika.URLParameters(url)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise InvalidConfig(f"not a usable AMQP URL: {exc}") from None


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``, safe for logs and reprs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def property_fields(entry: OutboxMessage) -> dict[str, Any]:
    """AMQP properties of an entry: persistent JSON, ids, and its stream position in headers.

    The entry's own headers (for example a W3C ``traceparent``) are kept; the names
    ``seq``, ``aggregate_id``, ``aggregate_type`` and ``causation_id`` are reserved. The
    same fields serve pika (:func:`properties_for`) and aio-pika.
    """
    headers: dict[str, Any] = dict(entry.headers)
    headers.update(
        seq=entry.seq, aggregate_id=entry.aggregate_id, aggregate_type=entry.aggregate_type
    )
    if entry.causation_id is not None:
        headers["causation_id"] = entry.causation_id
    return {
        "content_type": "application/json",
        "delivery_mode": 2,  # persistent
        "message_id": entry.id,
        "type": entry.type,
        "timestamp": int(entry.created_at.timestamp()),
        "correlation_id": entry.correlation_id,
        "headers": headers,
    }


def message_for(
    entry: OutboxMessage, wire: WireFormat = WireFormat.PLAIN
) -> tuple[bytes, dict[str, Any]]:
    """The body and AMQP property fields of an entry in ``wire`` format.

    Plain: :func:`~docoutbox.codec.encode_entry` with :func:`property_fields`. CloudEvents
    structured: the event as the body (``application/cloudevents+json``), the same
    properties otherwise. CloudEvents binary: the payload as the body and the attributes
    as ``cloudEvents:``-prefixed headers (the AMQP binding), ``message_id``, ``type`` and
    ``timestamp`` kept.
    """
    encoded = encode(entry, wire)
    fields = property_fields(entry)
    fields["content_type"] = encoded.content_type
    if encoded.attributes:
        fields["headers"] = encoded.headers(AMQP_PREFIX)
    return encoded.body, fields


def properties_for(entry: OutboxMessage) -> Any:
    """:func:`property_fields` as pika ``BasicProperties``."""
    return pika.BasicProperties(**property_fields(entry))


#: RabbitMQ's default ``max_message_size`` (128 MiB).
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024


class Routing:
    """What the pika and aio-pika publishers share: where an entry goes and its message.

    Options: ``routing_key`` and ``route`` (see :meth:`routing_key_for`), ``mandatory``,
    ``max_message_size``, ``probe_idle`` (seconds unused before a connection is probed)
    and ``wire`` (:class:`~docoutbox.codec.WireFormat`)."""

    def __init__(
        self,
        url: str,
        exchange: str = "",
        *,
        routing_key: str | None = None,
        route: Callable[[OutboxMessage], str] | None = None,
        mandatory: bool = True,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        probe_idle: float = 1.0,
        wire: WireFormat = WireFormat.PLAIN,
    ) -> None:
        check_url(url)
        if not isinstance(exchange, str):
            raise InvalidConfig(f"exchange must be a str, got {type(exchange).__name__}")
        self.wire = WireFormat(wire)
        self.exchange = exchange
        self.routing_key = routing_key
        self.route = route
        self.mandatory = mandatory
        self.max_message_size = max_message_size
        self.probe_idle = probe_idle
        self._url = url
        #: The URL as error messages name it (masked once: it took 5 µs per publish).
        self._shown_url = masked(url)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {masked(self._url)} exchange={self.exchange!r}>"

    def routing_key_for(self, entry: OutboxMessage) -> str:
        if self.route is not None:
            return self.route(entry)
        return entry.destination or self.routing_key or entry.type

    def trace_attributes(self, entry: OutboxMessage) -> dict[str, str]:
        """OpenTelemetry attributes of publishing ``entry``, by the RabbitMQ messaging
        conventions: the exchange is the destination (``amq.default`` for the default
        exchange), the routing key its own attribute."""
        return {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": self.exchange or "amq.default",
            "messaging.rabbitmq.destination.routing_key": self.routing_key_for(entry),
        }

    def outgoing(self, entry: OutboxMessage) -> tuple[bytes, dict[str, Any], str, str]:
        """The body, property fields, routing key and a description of the publish of
        ``entry``; ``PermanentPublishError`` if it is over ``max_message_size``."""
        body, fields = message_for(entry, self.wire)
        if len(body) > self.max_message_size:
            raise PermanentPublishError(
                f"entry {entry.id}: {len(body)} bytes, over the broker's "
                f"max_message_size of {self.max_message_size} bytes"
            )
        key = self.routing_key_for(entry)
        where = f"exchange {self.exchange!r} routing key {key!r} on {self._shown_url}"
        return body, fields, key, f"publish entry {entry.id} to {where}"


@dataclass(frozen=True)
class Step:
    """One topology declaration: ``exchange`` (name, type), ``queue`` (name, arguments) or
    ``bind`` (queue, exchange, key)."""

    kind: str
    name: str
    exchange_type: str = ""
    arguments: dict[str, Any] | None = None
    exchange: str = ""
    key: str = ""


def topology(
    exchange: str,
    *,
    exchange_type: str = "topic",
    queues: Mapping[str, Iterable[str]] | None = None,
    dead_letters: str | None = None,
) -> list[Step]:
    """What :func:`declare` declares, in order; shared by the pika and aio-pika adapters."""
    steps: list[Step] = []
    arguments: dict[str, Any] = {}
    if dead_letters:
        steps.append(Step("exchange", dead_letters, exchange_type="fanout"))
        steps.append(Step("queue", dead_letters))
        steps.append(Step("bind", dead_letters, exchange=dead_letters))
        arguments["x-dead-letter-exchange"] = dead_letters
    if exchange:
        steps.append(Step("exchange", exchange, exchange_type=exchange_type))
    for queue, keys in (queues or {}).items():
        steps.append(Step("queue", queue, arguments=arguments or None))
        steps.extend(Step("bind", queue, exchange=exchange, key=k) for k in keys if exchange)
    return steps


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
    steps = topology(
        exchange, exchange_type=exchange_type, queues=queues, dead_letters=dead_letters
    )
    with translated("declare topology"):
        for step in steps:
            if step.kind == "exchange":
                channel.exchange_declare(step.name, exchange_type=step.exchange_type, durable=True)
            elif step.kind == "queue":
                channel.queue_declare(step.name, durable=True, arguments=step.arguments)
            else:
                channel.queue_bind(step.name, step.exchange, routing_key=step.key or None)
