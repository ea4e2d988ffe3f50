"""The dispatch ports' contracts, over every adapter: in memory, mongomock where it can
(it has no change streams), the MongoDB wire server (sync, AsyncMongoClient, Motor), and
Cosmos DB (azure-cosmos sync and aio)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import mongomock
import pytest
from mongomock_motor import AsyncMongoMockClient
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import AsyncMongoClient, MongoClient

from docoutbox.store.api import AggregateStore
from docoutbox.testing import (
    AsyncMemoryPublisher,
    MemoryBackend,
    MemoryDeadLetters,
    MemoryPublisher,
)
from docoutbox.testing.blocking import BlockingStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints, MemoryLeaseTable
from docoutbox.testing.dispatch_contract import (
    NOW,
    ChangeSourceContract,
    CheckpointsContract,
    DeadLettersContract,
    LeaseTableContract,
    PublisherContract,
    events_until,
)
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource
from docoutbox_cosmos.coordination import (
    AsyncCosmosCheckpoints,
    AsyncCosmosDeadLetters,
    CosmosCheckpoints,
    CosmosDeadLetters,
    CosmosLeaseTable,
)
from docoutbox_cosmos.leases import CosmosFeedRangeLeases, LeasedChangeSource
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource
from docoutbox_mongo.coordination import (
    AsyncMongoCheckpoints,
    AsyncMongoDeadLetters,
    MongoCheckpoints,
    MongoDeadLetters,
    MongoLeaseTable,
)
from tests.conftest import server_uri
from tests.support.cosmos import async_container, create_container, scratch_database


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
            self.sync_db = mongomock.MongoClient()[self.name]
            return
        if kind == "mongomock-motor":
            self.loop = asyncio.new_event_loop()
            self.async_db = AsyncMongoMockClient()[self.name]
            return

        uri = server_uri("wire", request)
        client: Any = MongoClient(uri, uuidRepresentation="standard")
        self.sync_db = client[self.name]
        self._closers.append(lambda: client.drop_database(self.name))
        self._closers.append(client.close)
        if kind == "wire":
            return
        self.loop = asyncio.new_event_loop()
        if kind == "wire-motor":
            aclient: Any = AsyncIOMotorClient(uri, io_loop=self.loop)
            self._closers.insert(0, aclient.close)
        else:
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
        source = source_dbs.port(MongoChangeSource, AsyncMongoChangeSource, "aggs")
        return source, MongoBackend(source_dbs.sync_db["aggs"])

    def test_an_event_carries_only_what_the_dispatcher_reads(
        self, change_source: tuple[Any, Any]
    ) -> None:
        """Not the state, the inbox or the update description: an event stays small
        however large the document (an event over 16 MiB would stop the stream)."""
        source, backend = change_source
        store = AggregateStore(backend, Counter)
        source.open(source.start_marker())
        try:
            store.handle("a", add_msg("m1", 7), counter_handlers, create=True)
            store.handle("a", add_msg("m2", 8), counter_handlers)
            events = [e for e in events_until(source, lambda seen: len(seen) >= 2) if e.document]
            stored = backend.load("a")
            assert stored["state"] and stored["inbox"]
            for event in events:
                # outbox_seq guards a release, version a settle of the due-time hint;
                # ``cancelled`` and ``earliest_due`` come too once the document has
                # scheduled entries.
                fields = {"_id", "partition", "outbox", "updated_at", "outbox_seq", "version"}
                assert set(event.document) == fields
            last = events[-1].document
            assert last["outbox"] == stored["outbox"] and last["partition"] == stored["partition"]
        finally:
            source.close()


class TestMemoryCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self) -> Any:
        return MemoryCheckpoints()


class TestMongoCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self, checkpoint_dbs: Databases) -> Any:
        return checkpoint_dbs.port(MongoCheckpoints, AsyncMongoCheckpoints, "checkpoints")


class TestMemoryLeaseTable(LeaseTableContract):
    @pytest.fixture
    def lease_table(self) -> Any:
        return MemoryLeaseTable()


class TestMongoLeaseTable(LeaseTableContract):
    @pytest.fixture
    def lease_table(self, lease_dbs: Databases) -> Any:
        return lease_dbs.port(MongoLeaseTable, None, "leases", "group")


class TestMemoryDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self) -> tuple[Any, Any]:
        port = MemoryDeadLetters()
        return port, lambda: len(port.entries)


class TestMongoDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self, dead_letter_dbs: Databases) -> tuple[Any, Any]:
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


class CosmosPorts:
    """A fresh database; ports over its containers, from azure-cosmos sync or aio (used
    through a blocking wrapper)."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.account = request.getfixturevalue("cosmos_server")
        self._scratch = scratch_database(self.account)
        self.db = self._scratch.__enter__()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closers: list[Callable[[], None]] = []
        if kind == "aio":
            self.loop = asyncio.new_event_loop()

    def container(self, name: str) -> Any:
        return create_container(self.db, name)

    def port(self, sync_type: Any, async_type: Any, name: str) -> Any:
        """``sync_type(container)``, or ``async_type`` over an aio proxy of it."""
        container = self.container(name)
        if self.loop is None:
            return sync_type(container)

        proxy, close = async_container(self.account, self.db.id, name, self.loop)
        self._closers.append(close)
        return BlockingStore(async_type(proxy), self.loop)

    def close(self) -> None:
        for close in self._closers:
            close()
        if self.loop is not None:
            self.loop.close()
        self._scratch.__exit__(None, None, None)


@pytest.fixture(params=["sync", "aio"])
def cosmos_ports(request: pytest.FixtureRequest) -> Iterator[CosmosPorts]:
    ports = CosmosPorts(request.param, request)
    yield ports
    ports.close()


@pytest.fixture
def cosmos_sync(request: pytest.FixtureRequest) -> Iterator[CosmosPorts]:
    """For the ports that are sync only: lease tables, heartbeated on a thread."""
    ports = CosmosPorts("sync", request)
    yield ports
    ports.close()


@pytest.mark.cosmos
class TestCosmosChangeSource(ChangeSourceContract):
    ordered_across_aggregates = False  # ordered per feed range

    @pytest.fixture
    def change_source(self, cosmos_ports: CosmosPorts) -> tuple[Any, Any]:
        source = cosmos_ports.port(CosmosChangeSource, AsyncCosmosChangeSource, "aggs")
        return source, CosmosBackend(cosmos_ports.db.get_container_client("aggs"))


@pytest.mark.cosmos
class TestCosmosLeasedChangeSource(ChangeSourceContract):
    """The change feed of the feed ranges held, every one of them here."""

    ordered_across_aggregates = False

    @pytest.fixture
    def change_source(self, cosmos_sync: CosmosPorts) -> tuple[Any, Any]:
        aggs = cosmos_sync.container("aggs")
        table = CosmosFeedRangeLeases(cosmos_sync.container("leases"), aggs, "g")
        for p in range(table.partitions):
            assert table.acquire(p, "me", NOW, NOW + timedelta(hours=1))
        return LeasedChangeSource(aggs, table), CosmosBackend(aggs)


@pytest.mark.cosmos
class TestCosmosCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self, cosmos_ports: CosmosPorts) -> Any:
        return cosmos_ports.port(CosmosCheckpoints, AsyncCosmosCheckpoints, "checkpoints")


@pytest.mark.cosmos
class TestCosmosLeaseTable(LeaseTableContract):
    @pytest.fixture(params=["feed-ranges", "partition-numbers"])
    def lease_table(self, request: pytest.FixtureRequest, cosmos_sync: CosmosPorts) -> Any:
        leases = cosmos_sync.container("leases")
        if request.param == "partition-numbers":
            return CosmosLeaseTable(leases, "group")
        return CosmosFeedRangeLeases(leases, cosmos_sync.container("aggs"), "group")


@pytest.mark.cosmos
class TestCosmosDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self, cosmos_ports: CosmosPorts) -> tuple[Any, Any]:
        port = cosmos_ports.port(CosmosDeadLetters, AsyncCosmosDeadLetters, "dead")
        container = cosmos_ports.db.get_container_client("dead")

        def count() -> int:
            sql = "SELECT VALUE COUNT(1) FROM c"
            return int(next(iter(container.query_items(sql, enable_cross_partition_query=True))))

        return port, count
