"""Publish a stored body again to a queue (replaying a delivery a consumer rejected)."""

from __future__ import annotations

import pika  # type: ignore[import-untyped, unused-ignore]

from docoutbox_rabbitmq.amqp import masked
from docoutbox_rabbitmq.errors import translated


def publish_body(url: str, queue: str, body: bytes) -> None:
    """Publish ``body`` persistent to ``queue`` through the default exchange, confirmed.

    Raises ``PublishError`` if the broker refuses or returns it (no such queue), and
    ``BrokerUnavailable`` if it cannot be reached.
    """
    params = pika.URLParameters(url)
    params.client_properties = {"connection_name": "docoutbox-replay"}
    with translated(f"replay to queue {queue!r} on {masked(url)}"):
        connection = pika.BlockingConnection(params)
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish(
                "",
                queue,
                body,
                pika.BasicProperties(
                    content_type="application/json", delivery_mode=pika.DeliveryMode.Persistent
                ),
                mandatory=True,
            )
        finally:
            if connection.is_open:
                connection.close()
