"""Shared pieces of the broker tests: a receiving aggregate, entries, and a RabbitMQ sandbox."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from docoutbox.model import AggregateId
from docoutbox.store.document import Document
from docoutbox.store.plans import WritePlan
from docoutbox.testing import MemoryBackend
from tests.support.required import missing
from tests.support.servers import rabbitmq_available, rabbitmq_url


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
