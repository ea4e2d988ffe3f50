"""Two leased dispatchers, built with the composition root's one call, share a collection
on MongoDB and on Cosmos DB: every committed entry is published, and every outbox ends
empty."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, Dispatcher
from docoutbox.ports.kit import StoreKit
from docoutbox.testing import MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from examples.leased_dispatch.app import cosmos_kit, leased_dispatcher, mongo_kit
from tests.support.cosmos import create_container

AGGREGATES = 12


def _drain(open_kit: Callable[[], StoreKit]) -> None:
    kits = [open_kit() for _ in range(3)]
    store = AggregateStore(kits[0].backend, Counter)
    for i in range(AGGREGATES):
        store.handle(f"a{i}", add_msg(f"m{i}", emits=2), counter_handlers, create=True)
    publisher = MemoryPublisher()
    dispatchers = [leased_dispatcher(kit, publisher, "example", lease_ttl=2.0) for kit in kits[1:]]
    threads = [threading.Thread(target=d.run, daemon=True) for d in dispatchers]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _all_published(publisher):
            time.sleep(0.05)
    finally:
        for dispatcher in dispatchers:
            dispatcher.stop()
        for thread in threads:
            thread.join(30)
    assert all(isinstance(d, Dispatcher) for d in dispatchers)
    assert _all_published(publisher)
    assert all(
        store.load(f"a{i}").outbox == ()
        for i in range(AGGREGATES)  # type: ignore[union-attr]
    )
    for kit in kits:
        kit.close()


def _all_published(publisher: MemoryPublisher) -> bool:
    return {(e.aggregate_id, e.seq) for e in publisher.published} == {
        (f"a{i}", seq) for i in range(AGGREGATES) for seq in (1, 2)
    }


@pytest.mark.wire
def test_leased_dispatchers_on_mongodb(mongo_uri: str) -> None:
    database = f"example_{uuid.uuid4().hex[:8]}"
    _drain(lambda: mongo_kit(mongo_uri, database, "accounts"))


@pytest.mark.cosmos
def test_leased_dispatchers_on_cosmos_db(
    cosmos_server: CosmosAccount, cosmos_database: Any
) -> None:
    container = create_container(cosmos_database)
    _drain(
        lambda: cosmos_kit(
            cosmos_server.endpoint,
            cosmos_server.key,
            cosmos_database.id,
            container.id,
            **cosmos_server.client_kwargs,
        )
    )
