"""Shared pieces of the broker tests: a receiving aggregate, entries, and a RabbitMQ sandbox."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions

from docoutbox.model import AggregateId
from docoutbox.store.document import Document
from docoutbox.store.plans import WritePlan
from docoutbox.testing import MemoryBackend
from tests.support.required import missing
from tests.support.servers import rabbitmq_available, rabbitmq_url


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


class FaultyBackend(MemoryBackend):
    """A memory backend with scripted faults.

    ``load_errors`` are raised by the next loads, one each; ``refuse_writes`` conditional
    writes report a conflict; ``after_write`` runs after each successful write.
    """

    def __init__(self) -> None:
        super().__init__()
        self.load_errors: list[Exception] = []
        self.refuse_writes = 0
        self.after_write: Callable[[], None] | None = None

    def load(self, aggregate_id: AggregateId) -> Document | None:
        if self.load_errors:
            raise self.load_errors.pop(0)
        return super().load(aggregate_id)

    def write(self, plan: WritePlan) -> bool:
        if self.refuse_writes > 0:
            self.refuse_writes -= 1
            return False
        done = super().write(plan)
        if done and self.after_write is not None:
            self.after_write()
        return done


def require_rabbitmq() -> str:
    """The broker URL; skips (or fails under DOCOUTBOX_REQUIRE_SERVERS=1) if unreachable."""
    url = rabbitmq_url()
    reason = rabbitmq_available(url)
    if reason:
        missing(f"{reason}; run scripts/servers.sh start-rabbitmq")
    return url


def broker_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return (parts.hostname or "127.0.0.1", parts.port or 5672)


def through(url: str, port: int) -> str:
    """``url`` rewritten to reach the broker through a local proxy on ``port``."""
    parts = urlsplit(url)
    creds = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{creds}127.0.0.1:{port}"))
