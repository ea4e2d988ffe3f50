"""A commit whose reply is lost on MongoDB (the TCP proxy drops the server's answer), on
the last attempt: the store reads the document back before it answers, sync and async,
as on Cosmos DB (``test_cosmos_store.py``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from docoutbox import AggregateStore, AsyncAggregateStore, RetryPolicy, StoreConfig
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.wire

LAST = StoreConfig(retry=RetryPolicy(max_attempts=1))
#: No heartbeat during the test: the proxy drops the next reply on any connection.
QUIET = (
    "heartbeatFrequencyMS=60000&serverMonitoringMode=poll&serverSelectionTimeoutMS=5000"
    "&directConnection=true"
)


@pytest.fixture
def proxied(mongo_uri: str) -> Iterator[tuple[TcpProxy, str, str]]:
    """(proxy, URI through it, scratch database name); the database is dropped after."""
    host, port = mongo_uri.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    name = f"doubt_{uuid.uuid4().hex[:10]}"
    with TcpProxy((host, int(port))) as proxy:
        yield proxy, f"mongodb://127.0.0.1:{proxy.port}/?{QUIET}", name
    with MongoClient(mongo_uri) as client:
        client.drop_database(name)


def test_a_lost_reply_on_the_last_attempt_is_read_back(
    proxied: tuple[TcpProxy, str, str],
) -> None:
    proxy, uri, name = proxied
    with MongoClient(uri) as client:
        store = AggregateStore(MongoBackend(client[name]["counters"]), Counter, LAST)
        store.create("c", Counter())
        proxy.drop_next_reply()
        outcome = store.handle("c", add_msg("m1", emits=1), counter_handlers)
        assert outcome.status.value == "applied"  # was TransientStoreError
        snap = store.get("c")
        assert (snap.version, snap.state.applied) == (1, ["m1"])
        assert [e.id for e in snap.outbox] == [e.id for e in outcome.emitted]


def test_a_lost_reply_on_the_last_attempt_is_read_back_async(
    proxied: tuple[TcpProxy, str, str],
) -> None:

    proxy, uri, name = proxied

    async def scenario() -> None:
        client: Any = AsyncMongoClient(uri)
        try:
            store = AsyncAggregateStore(AsyncMongoBackend(client[name]["counters"]), Counter, LAST)
            await store.create("c", Counter())
            proxy.drop_next_reply()
            outcome = await store.handle("c", add_msg("m1", emits=1), counter_handlers)
            assert outcome.status.value == "applied"
            snap = await store.get("c")
            assert (snap.version, snap.state.applied) == (1, ["m1"])
        finally:
            await client.close()

    asyncio.run(scenario())
