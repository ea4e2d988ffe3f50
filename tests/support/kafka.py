"""Kafka for the tests: the proxied listener, and a broker the test requires.

Where the broker is and uniquely named topics on it are in :mod:`benchmarks.servers`.
"""

from __future__ import annotations

from benchmarks.servers import kafka_available, kafka_bootstrap, kafka_port
from tests.support.required import missing


def proxied_ports() -> tuple[int, int]:
    """(the broker's PROXIED listener, the port it advertises): a test proxy joins them."""
    return kafka_port() + 2, kafka_port() + 3


def require_kafka() -> str:
    """The bootstrap servers; skips (or fails under DOCOUTBOX_REQUIRE_SERVERS=1) if absent."""
    bootstrap = kafka_bootstrap()
    reason = kafka_available(bootstrap)
    if reason:
        missing(f"{reason}; run scripts/servers.sh install-kafka start-kafka")
    return bootstrap
