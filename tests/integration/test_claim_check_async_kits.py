"""The async kits open their payload stores (``kit.payloads``), and an async store with a
claim check puts through them: MongoDB (AsyncMongoClient and Motor) and Cosmos DB (aio)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymongo import MongoClient

from benchmarks.servers import CosmosAccount
from docoutbox import AsyncAggregateStore, StoreConfig
from docoutbox.ports.payloads import AsyncPayloadKit
from docoutbox.stored.claim import ClaimCheck, resolve_reference_async
from docoutbox_cosmos import open_async_kit as open_cosmos
from docoutbox_mongo import open_async_kit as open_mongo
from tests.support.cosmos import create_container, scratch_database, unique
from tests.unit.test_claim_check import BIG, Box, emit, message


async def handled_and_resolved(kit: Any) -> None:
    assert isinstance(kit, AsyncPayloadKit)
    payloads = kit.payloads
    store = AsyncAggregateStore(
        kit.backend, Box, StoreConfig(claim_check=ClaimCheck(payloads, threshold=1000))
    )
    assert (await store.handle("a", message(1), emit(BIG), create=True)).applied
    (entry,) = (await store.get("a")).outbox
    assert await resolve_reference_async(entry.payload, payloads) == BIG


@pytest.mark.wire
@pytest.mark.parametrize("driver", ["pymongo", "motor"])
def test_async_mongo_kits_open_their_payload_store(mongo_uri: str, driver: str) -> None:
    name = unique("claim_async")
    client: Any = MongoClient(mongo_uri)

    async def main() -> None:
        kit = await open_mongo(mongo_uri, name, "boxes", driver=driver)
        try:
            await handled_and_resolved(kit)
        finally:
            await kit.close()

    try:
        asyncio.run(main())
        assert client[name]["boxes_payloads"].count_documents({}) == 2  # manifest, a chunk
    finally:
        client.drop_database(name)
        client.close()


@pytest.mark.cosmos
def test_the_async_cosmos_kit_opens_its_payload_container(cosmos_server: CosmosAccount) -> None:
    with scratch_database(cosmos_server) as database:
        create_container(database, "boxes")

        async def main() -> None:
            kit = await open_cosmos(
                cosmos_server.endpoint,
                cosmos_server.key,
                database.id,
                "boxes",
                client_options=cosmos_server.client_kwargs,
            )
            try:
                await handled_and_resolved(kit)
            finally:
                await kit.close()

        asyncio.run(main())
        assert "boxes_payloads" in [c["id"] for c in database.list_containers()]
