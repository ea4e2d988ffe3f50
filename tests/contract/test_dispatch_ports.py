"""The dispatch ports' contracts, over every adapter: in memory, mongomock where it can
(it has no change streams), the MongoDB wire server (sync, AsyncMongoClient, Motor), and
Cosmos DB (azure-cosmos sync and aio)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from docoutbox.testing import (
    AsyncMemoryPublisher,
    MemoryBackend,
    MemoryDeadLetters,
    MemoryPublisher,
)
from docoutbox.testing.blocking import BlockingStore
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints, MemoryLeaseTable
from docoutbox.testing.dispatch_contract import (
    NOW,
    ChangeSourceContract,
    CheckpointsContract,
    DeadLettersContract,
    LeaseTableContract,
    PublisherContract,
)
from tests.conftest import server_uri


class Databases:
    """Fresh databases of one kind; ``async_`` ones are used through a blocking wrapper."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.name = f"ports_{uuid.uuid4().hex[:10]}"
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closers: list[Callable[[], None]] = []
        self.sync_db: Any = None
        self.async_db: Any = None
        if kind == "mongomock":
            import mongomock

            self.sync_db = mongomock.MongoClient()[self.name]
            return
        if kind == "mongomock-motor":
            from mongomock_motor import AsyncMongoMockClient

            self.loop = asyncio.new_event_loop()
            self.async_db = AsyncMongoMockClient()[self.name]
            return
        from pymongo import MongoClient

        uri = server_uri("wire", request)
        client: Any = MongoClient(uri, uuidRepresentation="standard")
        self.sync_db = client[self.name]
        self._closers.append(lambda: client.drop_database(self.name))
        self._closers.append(client.close)
        if kind == "wire":
            return
        self.loop = asyncio.new_event_loop()
        if kind == "wire-motor":
            from motor.motor_asyncio import AsyncIOMotorClient

            aclient: Any = AsyncIOMotorClient(uri, io_loop=self.loop)
            self._closers.insert(0, aclient.close)
        else:
            from pymongo import AsyncMongoClient

            aclient = AsyncMongoClient(uri)
            loop = self.loop
            self._closers.insert(0, lambda: loop.run_until_complete(aclient.close()))
        self.async_db = aclient[self.name]

    def port(self, sync_type: Any, async_type: Any, collection: str, *args: Any) -> Any:
        if self.async_db is None:
            return sync_type(self.sync_db[collection], *args)
        assert self.loop is not None
        return BlockingStore(async_type(self.async_db[collection], *args), self.loop)

    def close(self) -> None:
        for close in self._closers:
            close()
        if self.loop is not None:
            self.loop.close()


def databases(kinds: list[str]) -> Callable[..., Iterator[Databases]]:
    @pytest.fixture(params=kinds)
    def fixture(request: pytest.FixtureRequest) -> Iterator[Databases]:
        dbs = Databases(request.param, request)
        yield dbs
        dbs.close()

    return fixture


source_dbs = databases(["wire", "wire-async", "wire-motor"])
checkpoint_dbs = databases(["mongomock", "mongomock-motor", "wire", "wire-async", "wire-motor"])
lease_dbs = databases(["mongomock", "wire"])
dead_letter_dbs = databases(["mongomock", "mongomock-motor", "wire", "wire-async", "wire-motor"])


class TestMemoryChangeSource(ChangeSourceContract):
    @pytest.fixture
    def change_source(self) -> tuple[Any, Any]:
        backend = MemoryBackend()
        return MemoryChangeSource(backend), backend


@pytest.mark.wire
class TestMongoChangeSource(ChangeSourceContract):
    @pytest.fixture
    def change_source(self, source_dbs: Databases) -> tuple[Any, Any]:
        from docoutbox_mongo import AsyncMongoChangeSource, MongoBackend, MongoChangeSource

        source = source_dbs.port(MongoChangeSource, AsyncMongoChangeSource, "aggs")
        return source, MongoBackend(source_dbs.sync_db["aggs"])


class TestMemoryCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self) -> Any:
        return MemoryCheckpoints()


class TestMongoCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self, checkpoint_dbs: Databases) -> Any:
        from docoutbox_mongo import AsyncMongoCheckpoints, MongoCheckpoints

        return checkpoint_dbs.port(MongoCheckpoints, AsyncMongoCheckpoints, "checkpoints")


class TestMemoryLeaseTable(LeaseTableContract):
    @pytest.fixture
    def lease_table(self) -> Any:
        return MemoryLeaseTable()


class TestMongoLeaseTable(LeaseTableContract):
    @pytest.fixture
    def lease_table(self, lease_dbs: Databases) -> Any:
        from docoutbox_mongo import MongoLeaseTable

        return lease_dbs.port(MongoLeaseTable, None, "leases", "group")


class TestMemoryDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self) -> tuple[Any, Any]:
        port = MemoryDeadLetters()
        return port, lambda: len(port.entries)


class TestMongoDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self, dead_letter_dbs: Databases) -> tuple[Any, Any]:
        from docoutbox_mongo import AsyncMongoDeadLetters, MongoDeadLetters

        port = dead_letter_dbs.port(MongoDeadLetters, AsyncMongoDeadLetters, "dead")
        if dead_letter_dbs.async_db is not None:
            loop, coll = dead_letter_dbs.loop, dead_letter_dbs.async_db["dead"]
            assert loop is not None
            return port, lambda: loop.run_until_complete(coll.count_documents({}))
        return port, lambda: dead_letter_dbs.sync_db["dead"].count_documents({})


class TestMemoryPublisher(PublisherContract):
    @pytest.fixture(params=["sync", "async"])
    def publisher(
        self, request: pytest.FixtureRequest, event_loop_: asyncio.AbstractEventLoop
    ) -> tuple[Any, Any]:
        sync = MemoryPublisher()
        port = (
            sync
            if request.param == "sync"
            else BlockingStore(AsyncMemoryPublisher(sync), event_loop_)
        )
        return port, sync.ids


# -- Cosmos DB (the session's account: the local server has four feed ranges) ------------


@pytest.fixture
def cosmos_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    from tests.support.cosmos import scratch_database

    with scratch_database(request.getfixturevalue("cosmos_server")) as database:
        yield database


@pytest.mark.cosmos
class TestCosmosChangeSource(ChangeSourceContract):
    ordered_across_aggregates = False  # ordered per feed range

    @pytest.fixture(params=["every-range", "leased"])
    def change_source(self, request: pytest.FixtureRequest, cosmos_db: Any) -> tuple[Any, Any]:
        from docoutbox_cosmos import (
            CosmosBackend,
            CosmosChangeSource,
            CosmosFeedRangeLeases,
            LeasedChangeSource,
        )
        from tests.support.cosmos import create_container

        container = create_container(cosmos_db, "aggs")
        if request.param == "every-range":
            return CosmosChangeSource(container), CosmosBackend(container)
        table = CosmosFeedRangeLeases(create_container(cosmos_db, "leases"), container, "g")
        for p in range(table.partitions):
            assert table.acquire(p, "me", NOW, NOW + timedelta(hours=1))
        return LeasedChangeSource(container, table), CosmosBackend(container)


@pytest.mark.cosmos
class TestCosmosCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self, cosmos_db: Any) -> Any:
        from docoutbox_cosmos import CosmosCheckpoints
        from tests.support.cosmos import create_container

        return CosmosCheckpoints(create_container(cosmos_db, "checkpoints"))


@pytest.mark.cosmos
class TestCosmosLeaseTable(LeaseTableContract):
    @pytest.fixture(params=["feed-ranges", "partition-numbers"])
    def lease_table(self, request: pytest.FixtureRequest, cosmos_db: Any) -> Any:
        from docoutbox_cosmos import CosmosFeedRangeLeases, CosmosLeaseTable
        from tests.support.cosmos import create_container

        leases = create_container(cosmos_db, "leases")
        if request.param == "partition-numbers":
            return CosmosLeaseTable(leases, "group")
        return CosmosFeedRangeLeases(leases, create_container(cosmos_db, "aggs"), "group")


@pytest.mark.cosmos
class TestCosmosDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self, cosmos_db: Any) -> tuple[Any, Any]:
        from docoutbox_cosmos import CosmosDeadLetters
        from tests.support.cosmos import create_container

        container = create_container(cosmos_db, "dead")

        def count() -> int:
            sql = "SELECT VALUE COUNT(1) FROM c"
            return int(next(iter(container.query_items(sql, enable_cross_partition_query=True))))

        return CosmosDeadLetters(container), count
