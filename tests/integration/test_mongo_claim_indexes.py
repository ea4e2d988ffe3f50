"""The claim check's indexes on the wire server: the kit's ``ensure_indexes`` (sync and
async), an aggregate store's with a claim check (sync, pymongo async and Motor) and the
sweep command's ports create them, idempotently. That every query reads by one of them is
checked in ``tests/unit/test_mongo_claim_indexes.py``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import AsyncMongoClient

from docoutbox import AggregateStore, AsyncAggregateStore, StoreConfig
from docoutbox.stored.claim import ClaimCheck
from docoutbox.testing.contract import Counter
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.admin import claim_ports
from docoutbox_mongo.coordination import DEAD_LETTER_INDEXES
from docoutbox_mongo.kit import open_async_kit, open_kit
from docoutbox_mongo.payloads import (
    INDEXES,
    AsyncMongoPayloads,
    MongoPayloads,
    payloads_collection,
)

pytestmark = pytest.mark.wire


def listed(collection: Any) -> dict[str, tuple[list[tuple[str, int]], dict[str, Any]]]:
    """The collection's indexes by name: keys, and the options the claim check sets."""
    found = {}
    for index in collection.list_indexes():
        options = {k: index[k] for k in ("sparse", "partialFilterExpression") if k in index}
        found[index["name"]] = ([(k, int(v)) for k, v in index["key"].items()], options)
    return found


def check_payloads(database: Any, collection: str) -> None:
    payloads = listed(database[payloads_collection(collection)])
    for name, keys, options in INDEXES:
        assert payloads[name] == (keys, options)


def check(database: Any, collection: str, dead_letters: str) -> None:
    check_payloads(database, collection)
    letters = listed(database[dead_letters])
    for name, keys, options in DEAD_LETTER_INDEXES:
        assert letters[name] == (keys, options)


def test_the_kit_creates_the_claim_check_indexes(mongo: Any, mongo_uri: str) -> None:
    collection, dead = f"c_{uuid.uuid4().hex[:8]}", f"d_{uuid.uuid4().hex[:8]}"
    kit = open_kit(mongo_uri, mongo.name, collection, dead_letters=dead)
    try:
        kit.ensure_indexes()
        kit.ensure_indexes()  # idempotent
    finally:
        kit.close()
    check(mongo, collection, dead)
    assert "docoutbox_due" in listed(mongo[collection])  # the collection's own, too


def test_the_async_kit_creates_them_too(mongo: Any, mongo_uri: str) -> None:
    collection, dead = f"c_{uuid.uuid4().hex[:8]}", f"d_{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        kit = await open_async_kit(mongo_uri, mongo.name, collection, dead_letters=dead)
        try:
            await kit.ensure_indexes()
            await kit.ensure_indexes()
        finally:
            await kit.close()

    asyncio.run(run())
    check(mongo, collection, dead)


def test_the_store_with_a_claim_check_creates_them(mongo: Any) -> None:
    collection = f"c_{uuid.uuid4().hex[:8]}"
    payloads = MongoPayloads(mongo[payloads_collection(collection)])
    config = StoreConfig(claim_check=ClaimCheck(payloads))
    store = AggregateStore(MongoBackend(mongo[collection]), Counter, config)
    store.ensure_indexes()
    store.ensure_indexes()
    check_payloads(mongo, collection)
    assert "docoutbox_due" in listed(mongo[collection])


@pytest.mark.parametrize("driver", ["pymongo", "motor"])
def test_the_async_store_creates_them_too(mongo: Any, mongo_uri: str, driver: str) -> None:
    collection = f"c_{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        client: Any = (AsyncMongoClient if driver == "pymongo" else AsyncIOMotorClient)(mongo_uri)
        try:
            database = client[mongo.name]
            payloads = AsyncMongoPayloads(database[payloads_collection(collection)])
            config = StoreConfig(claim_check=ClaimCheck(payloads))
            store = AsyncAggregateStore(AsyncMongoBackend(database[collection]), Counter, config)
            await store.ensure_indexes()
            await store.ensure_indexes()
        finally:
            closed = client.close()
            if closed is not None:
                await closed

    asyncio.run(run())
    check_payloads(mongo, collection)


def test_the_sweep_commands_ports_create_them(mongo: Any) -> None:
    collection, dead = f"c_{uuid.uuid4().hex[:8]}", f"d_{uuid.uuid4().hex[:8]}"
    claim_ports(mongo, collection, dead)
    claim_ports(mongo, collection, dead)
    check(mongo, collection, dead)
