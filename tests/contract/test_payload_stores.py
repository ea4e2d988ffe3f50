"""The payload store contract over every adapter: in memory (sync and async), the MongoDB
wire server (pymongo, AsyncMongoClient, Motor) and the local Cosmos DB server (sync and
aio); and what a put cut short leaves: nothing readable, a manifest the sweep finds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from docoutbox.errors import PayloadMissing
from docoutbox.testing.blocking import BlockingStore
from docoutbox.testing.payload_contract import T0, PayloadStoreContract, info
from docoutbox.testing.payloads import AsyncMemoryPayloads, MemoryPayloads
from docoutbox_cosmos.payloads import (
    AsyncCosmosPayloads,
    CosmosPayloads,
    create_payloads_container,
)
from docoutbox_mongo.payloads import AsyncMongoPayloads, MongoPayloads
from tests.contract.test_dispatch_ports import CosmosPorts, Databases
from tests.support.cosmos import async_container


class TestMemoryPayloads(PayloadStoreContract):
    @pytest.fixture(params=["sync", "async"])
    def payloads(self, request: pytest.FixtureRequest) -> Iterator[Any]:
        if request.param == "sync":
            yield MemoryPayloads()
            return
        loop = asyncio.new_event_loop()
        yield BlockingStore(AsyncMemoryPayloads(), loop)
        loop.close()


@pytest.fixture(params=["wire", "wire-async", "wire-motor"])
def mongo_dbs(request: pytest.FixtureRequest) -> Iterator[Databases]:
    dbs = Databases(request.param, request)
    yield dbs
    dbs.close()


@pytest.mark.wire
class TestMongoPayloads(PayloadStoreContract):
    @pytest.fixture
    def payloads(self, mongo_dbs: Databases) -> Any:
        return mongo_dbs.port(MongoPayloads, AsyncMongoPayloads, "aggs_payloads")


@pytest.fixture(params=["sync", "aio"])
def cosmos_dbs(request: pytest.FixtureRequest) -> Iterator[CosmosPorts]:
    ports = CosmosPorts(request.param, request)
    yield ports
    ports.close()


@pytest.mark.cosmos
class TestCosmosPayloads(PayloadStoreContract):
    @pytest.fixture
    def payloads(self, cosmos_dbs: CosmosPorts) -> Any:
        container = create_payloads_container(cosmos_dbs.db, "aggs_payloads")
        if cosmos_dbs.loop is None:
            return CosmosPayloads(container)
        proxy, close = async_container(
            cosmos_dbs.account, cosmos_dbs.db.id, "aggs_payloads", cosmos_dbs.loop
        )
        cosmos_dbs._closers.append(close)
        return BlockingStore(AsyncCosmosPayloads(proxy), cosmos_dbs.loop)


@pytest.mark.wire
def test_a_mongo_put_cut_short_reads_as_missing_and_is_found_by_age(
    request: pytest.FixtureRequest,
) -> None:
    """On the sync twin (the async ones share the layout and its functions)."""
    dbs = Databases("wire", request)
    try:
        payloads = MongoPayloads(dbs.sync_db["aggs_payloads"])
        collection = payloads.collection
        data = b"z" * (3 * 1024 * 1024)
        payloads.put(info("p", data), data)
        collection.delete_one({"p": "p", "n": 1})  # as if the put stopped before chunk 1
        with pytest.raises(PayloadMissing, match="chunks missing"):
            payloads.get("p")
        collection.update_one({"_id": "p"}, {"$set": {"finished": False}})
        with pytest.raises(PayloadMissing, match="did not finish"):
            payloads.get("p")
        (stale,) = payloads.stale(T0 + timedelta(seconds=1), 10)
        assert payloads.delete_stale(stale)
        assert collection.count_documents({}) == 0
    finally:
        dbs.close()


@pytest.mark.cosmos
def test_a_cosmos_put_cut_short_reads_as_missing_and_is_found_by_age(
    request: pytest.FixtureRequest,
) -> None:
    """On the sync twin (the aio one shares the layout and its functions)."""
    dbs = CosmosPorts("sync", request)
    try:
        payloads = CosmosPayloads(create_payloads_container(dbs.db, "aggs_payloads"))
        data = b"z" * (3 * 1024 * 1024)
        payloads.put(info("p", data), data)
        query = "SELECT * FROM c WHERE c.pid = 'p' AND c.n = 1"
        (chunk,) = payloads.container.query_items(query, partition_key="p")
        payloads.container.delete_item(chunk["id"], partition_key="p")
        with pytest.raises(PayloadMissing, match="chunks missing"):
            payloads.get("p")
        (stale,) = payloads.stale(T0 + timedelta(seconds=1), 10)
        assert payloads.delete_stale(stale)
        everything = "SELECT * FROM c WHERE c.pid = 'p'"
        assert list(payloads.container.query_items(everything, partition_key="p")) == []
    finally:
        dbs.close()
