"""The sync Cosmos DB client of ``docoutbox dispatch`` pools as many connections as its
workers use at once: urllib3 never discards one ("Connection pool is full")."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox.ports.kit import StoreSettings
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.clients import open_client, pool_size
from docoutbox_cosmos.kit import STORE
from tests.support.cosmos import create_container

pytestmark = pytest.mark.cosmos

WORKERS = 32


def _hammer(backend: CosmosBackend, rounds: int = 5) -> None:
    """``WORKERS`` threads reading at the same moment, ``rounds`` times."""
    barrier = threading.Barrier(WORKERS)

    def work() -> None:
        for _ in range(rounds):
            barrier.wait()
            backend.load("a")

    threads = [threading.Thread(target=work) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _discarded(caplog: pytest.LogCaptureFixture) -> int:
    return sum("Connection pool is full" in r.getMessage() for r in caplog.records)


def test_the_dispatch_client_keeps_a_connection_per_worker(
    cosmos_server: CosmosAccount, cosmos_database: Any, caplog: pytest.LogCaptureFixture
) -> None:
    container = create_container(cosmos_database)
    container.create_item({"id": "a", "aid": "a"})
    account = cosmos_server
    if not account.endpoint.startswith("http://"):
        pytest.skip("the local server over plain HTTP")  # the pool is the same over TLS
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        plain = open_client(account.endpoint, account.key)  # the SDK's default pool
        try:
            proxy = plain.get_database_client(cosmos_database.id).get_container_client(container.id)
            _hammer(CosmosBackend(proxy))
        finally:
            plain.close()
        assert _discarded(caplog) > 0  # what the dispatcher logged before
        caplog.clear()
        settings = StoreSettings(
            account.endpoint,
            cosmos_database.id,
            container.id,
            key=account.key,
            timeout=5.0,
            options={"concurrency": str(WORKERS)},
        )
        target = STORE.open(settings)
        try:
            _hammer(target.backend)
        finally:
            target.close()
    assert _discarded(caplog) == 0
    assert pool_size(WORKERS) >= 2 * WORKERS
