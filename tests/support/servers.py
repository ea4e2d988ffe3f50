"""Test servers: the in-memory MongoDB wire server and a RabbitMQ broker.

The MongoDB wire server is :mod:`docoutbox.testing.mongo_server` (shipped, so users can
start it too); the suite keeps its jars in ``tests/servers/mongo/lib``, fetched by
``scripts/servers.sh install-mongo``. RabbitMQ is started by
``scripts/servers.sh start-rabbitmq``. Only the standard library is imported at module
level; pika is imported lazily.

Fidelity gaps of the wire server versus real MongoDB are listed in ``tests/README.md``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from docoutbox.testing.mongo_server import MongoWireServer as _MongoWireServer
from docoutbox.testing.mongo_server import mongo_wire_server_available as _available

REPO_ROOT: Path = Path(__file__).resolve().parents[2]
MONGO_LIB: Path = REPO_ROOT / "tests" / "servers" / "mongo" / "lib"

DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBITMQ_URL_ENV = "DOCOUTBOX_RABBITMQ_URL"


class MongoWireServer(_MongoWireServer):
    """:class:`docoutbox.testing.mongo_server.MongoWireServer` over the repository's jars."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("lib", MONGO_LIB)
        super().__init__(**options)


def mongo_wire_server_available() -> str | None:
    """Return None when the wire server can be launched, else a human-readable reason."""
    return _available(MONGO_LIB)


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
