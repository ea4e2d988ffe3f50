"""RabbitMQ for the benchmarks and the tests: where the broker is, whether it answers, and
a sandbox of uniquely named exchanges and queues, deleted afterwards.

The broker is started by ``scripts/servers.sh start-rabbitmq``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions

DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBITMQ_URL_ENV = "DOCOUTBOX_RABBITMQ_URL"


def rabbitmq_url() -> str:
    """The broker URL: ``$DOCOUTBOX_RABBITMQ_URL`` or the local guest account."""
    return os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL


def rabbitmq_available(url: str, timeout: float = 3.0) -> str | None:
    """Return None when a pika BlockingConnection to ``url`` succeeds, else the reason."""
    try:
        params = pika.URLParameters(url)
    except ValueError as exc:
        return f"invalid RabbitMQ URL {url!r}: {exc}"
    params.connection_attempts = 1
    params.retry_delay = 0
    params.socket_timeout = timeout
    params.stack_timeout = timeout
    params.blocked_connection_timeout = timeout
    try:
        connection = pika.BlockingConnection(params)
    except (pika.exceptions.AMQPError, OSError) as exc:
        where = f"{params.host}:{params.port}"
        return f"RabbitMQ not reachable at {where}: {exc!r}"
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection.close()
    return None


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Sandbox:
    """Uniquely named exchanges and queues on a real broker, deleted afterwards."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    def names(self, *, exchange: bool = True) -> tuple[str, str, str]:
        """A fresh (exchange, queue, dead-letter name), registered for deletion."""
        ex = unique("dx-ex") if exchange else ""
        queue, dead = unique("dx-q"), unique("dx-dead")
        self.exchanges += [e for e in (ex, dead) if e]
        self.queues += [queue, dead]
        return ex, queue, dead

    def get(self, queue: str) -> tuple[Any, bytes] | None:
        """Take one message (auto-ack): (properties, body), or None if the queue is empty."""
        method, props, body = self.channel.basic_get(queue, auto_ack=True)
        return None if method is None else (props, body)

    def drain(self, queue: str) -> list[tuple[Any, bytes]]:
        out = []
        while (item := self.get(queue)) is not None:
            out.append(item)
        return out

    def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (unacked deliveries are not counted)."""
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)

    def close(self) -> None:
        """Delete what was declared, on a fresh connection: the first may have been idle
        past its heartbeat while a long test ran."""
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            self.connection.close()
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        for queue in self.queues:
            channel.queue_delete(queue)
        for exchange in self.exchanges:
            channel.exchange_delete(exchange)
        connection.close()


@contextmanager
def sandbox(url: str) -> Iterator[Sandbox]:
    box = Sandbox(url)
    try:
        yield box
    finally:
        box.close()
