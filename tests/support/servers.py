"""Test servers: RabbitMQ, and where the repository is.

RabbitMQ is started by ``scripts/servers.sh start-rabbitmq``; pika is imported lazily.
The MongoDB wire server, the Cosmos DB server and Kafka are in :mod:`benchmarks.servers`
(the benchmarks start them too). Fidelity gaps of the servers versus the real ones are
listed in ``tests/README.md``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

REPO_ROOT: Path = Path(__file__).resolve().parents[2]

DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBITMQ_URL_ENV = "DOCOUTBOX_RABBITMQ_URL"


def rabbitmq_url() -> str:
    """The broker URL: ``$DOCOUTBOX_RABBITMQ_URL`` or the local guest account."""
    return os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL


def rabbitmq_available(url: str, timeout: float = 3.0) -> str | None:
    """Return None when a pika BlockingConnection to ``url`` succeeds, else the reason."""
    try:
        import pika  # type: ignore[import-untyped, unused-ignore]
        import pika.exceptions  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return "pika is not installed"
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
