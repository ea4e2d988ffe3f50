"""Test servers: RabbitMQ (from :mod:`benchmarks.rabbit`), and where the repository is.

The MongoDB wire server, the Cosmos DB server and Kafka are in :mod:`benchmarks.servers`
(the benchmarks start them too). Fidelity gaps of the servers versus the real ones are
listed in ``tests/README.md``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.rabbit import (
    DEFAULT_RABBITMQ_URL,
    RABBITMQ_URL_ENV,
    rabbitmq_available,
    rabbitmq_url,
)

REPO_ROOT: Path = Path(__file__).resolve().parents[2]

__all__ = [
    "DEFAULT_RABBITMQ_URL",
    "RABBITMQ_URL_ENV",
    "REPO_ROOT",
    "rabbitmq_available",
    "rabbitmq_url",
]
