"""``store.handle`` against a database that cannot be reached, with default settings,
raises a TransientStoreError within 35 s (``RetryPolicy.deadline``, 30 s by default),
instead of retrying each attempt's full driver timeout ``max_attempts`` times (301 s
with a default ``MongoClient``: 10 x 30 s of server selection).

The bound of 35 s is the requirement itself (the deadline plus one attempt's slack),
the only timed assertion here.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from pymongo import MongoClient

from benchmarks.servers import CosmosServer, cosmos_server_available
from docoutbox import AggregateStore, AsyncAggregateStore
from docoutbox.errors import TransientStoreError
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend
from docoutbox_mongo import MongoBackend
from tests.conftest import missing
from tests.support.cosmos import create_container, unique

pytestmark = pytest.mark.slow

BOUND = 35.0


def closed_port() -> int:
    """A local port nothing listens on (taken from the OS, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_unreachable_mongodb_fails_within_the_deadline() -> None:

    client: Any = MongoClient(f"mongodb://127.0.0.1:{closed_port()}/")  # default settings
    try:
        store = AggregateStore(MongoBackend(client["shop"]["orders"]), Counter)
        started = time.monotonic()
        with pytest.raises(TransientStoreError, match=r"RetryPolicy\.deadline"):
            store.handle("a", add_msg("m1"), counter_handlers, create=True)
        assert time.monotonic() - started < BOUND
    finally:
        client.close()


def _cosmos_server() -> CosmosServer:
    reason = cosmos_server_available()
    if reason:
        missing(f"Cosmos DB server unavailable ({reason}); run scripts/servers.sh install-cosmos")
    return CosmosServer().start()


@pytest.mark.cosmos
def test_an_unreachable_cosmos_endpoint_fails_within_the_deadline() -> None:
    """The client must be made while the account answers (it reads the account then);
    the server stops afterwards, as an account that becomes unreachable."""

    server = _cosmos_server()
    try:
        client = server.account().client()  # default retry settings of azure-cosmos
        container = create_container(client.create_database(unique("unreachable")))
        store = AggregateStore(CosmosBackend(container), Counter)
    finally:
        server.stop()
    try:
        started = time.monotonic()
        with pytest.raises(TransientStoreError):
            store.handle("a", add_msg("m1"), counter_handlers, create=True)
        assert time.monotonic() - started < BOUND
    finally:
        client.close()


@pytest.mark.cosmos
def test_an_unreachable_cosmos_endpoint_fails_within_the_deadline_on_aio() -> None:

    server = _cosmos_server()

    async def scenario() -> None:
        try:
            account = server.account()
            with account.client() as sync:
                database = sync.create_database(unique("unreachable")).id
                name = create_container(sync.get_database_client(database)).id
            client = account.async_client()
            proxy = client.get_database_client(database).get_container_client(name)
            await proxy.read()  # the aio client reads the account on its first request
        finally:
            server.stop()
        try:
            store = AsyncAggregateStore(AsyncCosmosBackend(proxy), Counter)
            started = time.monotonic()
            with pytest.raises(TransientStoreError):
                await store.handle("a", add_msg("m1"), counter_handlers, create=True)
            assert time.monotonic() - started < BOUND
        finally:
            await client.close()

    asyncio.run(scenario())
