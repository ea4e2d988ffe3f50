"""The RabbitMQ adapter as the ``docoutbox.brokers`` entry point ``rabbitmq`` names it."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from docoutbox.errors import InvalidConfig
from docoutbox.ports.kit import BrokerSettings
from docoutbox_rabbitmq.publisher import RabbitPublisher


def with_timeout(url: str, seconds: float) -> str:
    """``url`` with pika's connection timeouts set, unless the URL sets them itself."""
    parts = urlsplit(url)
    query = parts.query
    for name in ("socket_timeout", "connection_attempts", "blocked_connection_timeout"):
        if name + "=" in query:
            return url
    extra = f"socket_timeout={seconds}&connection_attempts=1"
    return urlunsplit(parts._replace(query=f"{query}&{extra}" if query else extra))


class RabbitBroker:
    """:class:`~docoutbox.ports.kit.BrokerAdapter`: ``url`` is an ``amqp://`` URL,
    ``destination`` the exchange (None: the default exchange), ``declare`` an exchange type
    to declare at start (else the exchange must exist). It takes no ``options``: connection
    settings go in the URL's query (pika's ``URLParameters``)."""

    label = "RabbitMQ"
    extra = "rabbitmq"

    def publisher(self, settings: BrokerSettings) -> RabbitPublisher:
        if settings.options:
            raise InvalidConfig(
                f"the RabbitMQ broker takes no options (got {', '.join(sorted(settings.options))}):"
                " put connection settings in the URL's query"
            )
        publisher = RabbitPublisher(
            with_timeout(settings.url, settings.timeout),
            exchange=settings.destination or "",
            routing_key=settings.routing_key,
            wire=settings.wire,
        )
        try:
            publisher.check(declare_type=settings.declare)
        except BaseException:
            publisher.close()
            raise
        return publisher


#: The adapter the ``docoutbox.brokers`` entry point ``rabbitmq`` names.
BROKER = RabbitBroker()
