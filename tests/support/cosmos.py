"""Scratch Cosmos DB databases and containers for tests, on the session's account.

Every helper creates a database with a unique name and deletes only that database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from azure.cosmos import PartitionKey

from benchmarks.servers import CosmosAccount


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextmanager
def scratch_database(account: CosmosAccount) -> Iterator[Any]:
    """A sync ``DatabaseProxy`` of a fresh database, deleted afterwards."""
    client = account.client()
    database = client.create_database(unique("docoutbox_test"))
    try:
        yield database
    finally:
        client.delete_database(database.id)
        client.close()


def create_container(database: Any, name: str | None = None, path: str = "/id") -> Any:
    return database.create_container(name or unique("c"), PartitionKey(path=path))


def async_container(
    account: CosmosAccount, database: str, container: str, loop: asyncio.AbstractEventLoop
) -> tuple[Any, Callable[[], None]]:
    """An aio ``ContainerProxy`` bound to ``loop``, and how to close its client."""

    async def open_client() -> Any:
        return account.async_client()

    client = loop.run_until_complete(open_client())
    proxy = client.get_database_client(database).get_container_client(container)
    return proxy, lambda: loop.run_until_complete(client.close())


def all_items(database: Any, container: str) -> list[Any]:
    """Every item of ``container`` in ``database`` (a cross-partition query)."""
    proxy = database.get_container_client(container)
    return list(proxy.query_items("SELECT * FROM c", enable_cross_partition_query=True))
