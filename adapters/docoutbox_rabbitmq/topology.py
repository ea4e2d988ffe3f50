"""Declare the exchange, queues and dead-letter queue the publisher and consumers use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from docoutbox_rabbitmq.errors import translated


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
