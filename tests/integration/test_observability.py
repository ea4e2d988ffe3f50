"""Health and metrics served over HTTP.

Here: the health and metrics endpoint over HTTP; the in-memory pieces are in
``tests/unit/test_observability.py``.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from docoutbox import AggregateStore, Message
from docoutbox.dispatch.engine.backlog import (
    OutboxStats,
)
from docoutbox.errors import BrokerUnavailable
from docoutbox.observability.health import Endpoint, Health
from docoutbox.observability.prometheus import PrometheusMetrics
from docoutbox.testing import MemoryBackend
from tests.unit.test_observability import Box, handlers


def test_prometheus_exposition_and_the_endpoint() -> None:

    metrics = PrometheusMetrics()
    metrics.outbox(OutboxStats(5, 2, 1.5, None, datetime.now(UTC)))
    metrics.watch_queue(lambda: 3)
    dispatcher = SimpleNamespace(
        started=SimpleNamespace(is_set=lambda: True),
        stopping=False,
        stream_open=True,
        ownership=SimpleNamespace(owned=lambda: None),
        queued=lambda: 3,
    )
    health = Health(dispatcher)  # type: ignore[arg-type]
    endpoint = Endpoint(0, health=health, exposition=metrics.exposition).start()
    try:
        base = f"http://127.0.0.1:{endpoint.port}"
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "docoutbox_outbox_pending_entries 5.0" in text
        assert "docoutbox_dispatcher_queued 3.0" in text
        ready = json.loads(urllib.request.urlopen(f"{base}/readyz", timeout=5).read())
        assert ready["ready"] and ready["leases"] == "all"
        store = AggregateStore(MemoryBackend(), Box)
        entry = store.handle("b", Message(id="m", type="Put"), handlers, create=True).emitted[0]
        health.failed(entry, BrokerUnavailable("gone"))
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        assert err.value.code == 503
        health.published(entry, 0.1)
        assert urllib.request.urlopen(f"{base}/readyz", timeout=5).status == 200
    finally:
        endpoint.close()
