"""A missing Cosmos DB container or database is named as such, sync and async: never a
race ("existed on insert, then vanished"), never a healthy ``ensure_indexes()``, never a
bare ``404: {"message":""}``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, AsyncAggregateStore
from docoutbox.errors import PermanentStoreError
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend
from docoutbox_cosmos.admin import connect_database
from docoutbox_cosmos.errors import ContainerNotFound
from docoutbox_cosmos.kit import open_kit
from tests.support.cosmos import create_container, unique

pytestmark = pytest.mark.cosmos


def _missing(error: ContainerNotFound, database: str, container: str | None) -> None:
    assert isinstance(error, PermanentStoreError)
    assert (error.database, error.container) == (database, container)
    assert repr(container or database) in str(error) and "does not exist" in str(error)


def test_a_missing_container_is_named_by_create_handle_and_ensure_indexes(
    cosmos_database: Any,
) -> None:
    name = unique("absent")
    backend = CosmosBackend(cosmos_database.get_container_client(name))
    store = AggregateStore(backend, Counter)
    with pytest.raises(ContainerNotFound) as caught:
        store.create("a", Counter())
    _missing(caught.value, cosmos_database.id, name)
    fresh = AggregateStore(CosmosBackend(cosmos_database.get_container_client(name)), Counter)
    with pytest.raises(ContainerNotFound):
        fresh.handle("a", add_msg("m1"), counter_handlers, create=True)
    with pytest.raises(ContainerNotFound):
        CosmosBackend(cosmos_database.get_container_client(name)).ensure_indexes()


def test_a_missing_database_is_named(cosmos_server: CosmosAccount) -> None:
    absent = unique("absent_db")
    with cosmos_server.client() as client:
        container = client.get_database_client(absent).get_container_client("aggregates")
        store = AggregateStore(CosmosBackend(container), Counter)
        with pytest.raises(ContainerNotFound) as caught:
            store.get("a")
        _missing(caught.value, absent, None)
        with pytest.raises(ContainerNotFound):
            CosmosBackend(container).ensure_indexes()
    endpoint, key, options = (
        cosmos_server.endpoint,
        cosmos_server.key,
        cosmos_server.client_kwargs,
    )
    with pytest.raises(ContainerNotFound) as caught:
        connect_database(endpoint, key, absent, client_options=options)
    _missing(caught.value, absent, None)
    with pytest.raises(ContainerNotFound) as caught:
        open_kit(endpoint, key, absent, "aggregates", client_options=options)
    _missing(caught.value, absent, None)


def test_an_existing_container_still_reads_a_missing_item_as_none(cosmos_database: Any) -> None:
    container = create_container(cosmos_database)
    backend = CosmosBackend(container)
    store = AggregateStore(backend, Counter)
    assert backend.load("nobody") is None  # the container checked once: the item's 404
    backend.ensure_indexes()
    assert store.create("a", Counter()).created


def test_the_async_store_names_a_missing_container(
    cosmos_server: CosmosAccount, cosmos_database: Any
) -> None:
    name = unique("absent")

    async def scenario() -> None:
        async with cosmos_server.async_client() as client:
            proxy = client.get_database_client(cosmos_database.id).get_container_client(name)
            store = AsyncAggregateStore(AsyncCosmosBackend(proxy), Counter)
            with pytest.raises(ContainerNotFound) as caught:
                await store.create("a", Counter())
            _missing(caught.value, cosmos_database.id, name)
            with pytest.raises(ContainerNotFound):
                await AsyncCosmosBackend(proxy).ensure_indexes()
            gone = client.get_database_client(unique("absent_db")).get_container_client(name)
            with pytest.raises(ContainerNotFound) as caught:
                await AsyncAggregateStore(AsyncCosmosBackend(gone), Counter).get("a")
            assert caught.value.container is None

    asyncio.run(scenario())
