"""Shared fixtures: the servers the tests reach, and the matrix of store adapters.

Servers: the MongoDB wire-protocol server (mongo-java-server, started here) and, when
``MONGODB_URI`` is set, a real deployment too. Cosmos DB: ``cosmos_server``, the local
patched server (started here) or, when ``COSMOS_ENDPOINT``/``COSMOS_KEY`` are set, that
account instead. With ``DOCOUTBOX_REQUIRE_SERVERS=1`` or any truthy ``CI`` (``true``,
``1``, ``yes``...) a missing server fails the run instead of skipping. Every run ends with
a summary of what was skipped and why.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import mongomock
import pytest
from mongomock_motor import AsyncMongoMockClient
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import AsyncMongoClient, MongoClient

from benchmarks.rabbit import sandbox
from benchmarks.servers import (
    CosmosAccount,
    CosmosServer,
    MongoWireServer,
    Topics,
    cosmos_account_from_env,
    cosmos_server_available,
    mongo_wire_server_available,
)
from docoutbox import AggregateStore, AsyncAggregateStore, StoreConfig
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.blocking import BlockingStore
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from tests.support.cosmos import async_container, create_container, scratch_database
from tests.support.e2e import require_rabbitmq
from tests.support.kafka import require_kafka
from tests.support.required import REQUIRE_SERVERS, missing

MONGODB_URI = os.environ.get("MONGODB_URI")

#: Store adapters of the contract matrix. "wire-*" reach mongo-java-server; "uri-*" reach
#: MONGODB_URI and exist only when it is set.
STORE_KINDS = ["memory", "memory-async", "mongomock", "mongomock-motor"]
SERVER_KINDS = ["wire"] + (["uri"] if MONGODB_URI else [])
for _server in SERVER_KINDS:
    STORE_KINDS += [f"{_server}-sync", f"{_server}-async", f"{_server}-motor"]
#: Cosmos DB (the local server, or COSMOS_ENDPOINT/COSMOS_KEY): azure-cosmos sync and aio.
STORE_KINDS += ["cosmos-sync", "cosmos-aio"]


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """Each test leaves the root logger as it found it: a command run in-process configures
    logging on the stream of its test's output capture, which is closed afterwards, and a
    later test's library log line (say, py4j collecting a Spark connection) would then be
    reported as a logging error in that test's output."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def wire_server() -> Iterator[MongoWireServer]:
    reason = mongo_wire_server_available()
    if reason:
        missing(f"MongoDB wire server unavailable ({reason}); run scripts/servers.sh install")
    with MongoWireServer() as server:
        yield server


@pytest.fixture(scope="session")
def cosmos_server() -> Iterator[CosmosAccount]:
    """A Cosmos DB account for the session: COSMOS_ENDPOINT/COSMOS_KEY when both are set
    (a real account or the official emulator), else the local patched server."""
    account = cosmos_account_from_env()
    if account is not None:
        yield account
        return
    reason = cosmos_server_available()
    if reason:
        missing(f"Cosmos DB server unavailable ({reason}); run scripts/servers.sh install-cosmos")
    with CosmosServer() as server:
        yield server.account()


@pytest.fixture
def cosmos_database(cosmos_server: CosmosAccount) -> Iterator[Any]:
    """A sync ``DatabaseProxy`` of a fresh scratch database on the session's account,
    deleted afterwards; nothing else of the account is touched."""
    with scratch_database(cosmos_server) as database:
        yield database


@pytest.fixture
def box() -> Iterator[Any]:
    """A private RabbitMQ exchange and queues, deleted afterwards."""

    with sandbox(require_rabbitmq()) as created:
        yield created


@pytest.fixture(scope="session")
def kafka() -> str:
    """The bootstrap servers of the shared test Kafka broker."""

    return require_kafka()


@pytest.fixture
def topics(kafka: str) -> Iterator[Any]:
    """Private Kafka topics, deleted afterwards."""

    created = Topics(kafka)
    yield created
    created.close()


def server_uri(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "uri":
        assert MONGODB_URI
        return MONGODB_URI
    server: MongoWireServer = request.getfixturevalue("wire_server")
    return server.uri


@pytest.fixture
def mongo_uri(request: pytest.FixtureRequest) -> str:
    """The URI of the wire server (or of MONGODB_URI when set)."""
    return server_uri("uri" if MONGODB_URI else "wire", request)


@pytest.fixture
def event_loop_() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _collection_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=STORE_KINDS)
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """A factory of stores of one adapter kind, all over one fresh collection."""
    kind: str = request.param
    name = _collection_name()
    closers: list[Callable[[], None]] = []
    sync_factory: Callable[[], Any] | None = None
    async_factory: Callable[[], Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None

    if kind == "memory":
        memory = MemoryBackend()
        sync_factory = lambda: memory  # noqa: E731
    elif kind == "memory-async":
        shared = MemoryBackend()
        async_factory = lambda: AsyncMemoryBackend(shared)  # noqa: E731
    elif kind == "mongomock":
        collection = mongomock.MongoClient()["docoutbox"][name]
        sync_factory = lambda: MongoBackend(collection)  # noqa: E731
    elif kind.startswith("cosmos-"):
        stack = ExitStack()
        closers.append(stack.close)
        database = stack.enter_context(scratch_database(request.getfixturevalue("cosmos_server")))
        container = create_container(database)
        if kind == "cosmos-sync":
            sync_factory = lambda: CosmosBackend(container)  # noqa: E731
        else:
            loop = asyncio.new_event_loop()
            proxy, close = async_container(
                request.getfixturevalue("cosmos_server"), database.id, container.id, loop
            )
            closers.insert(0, close)
            async_factory = lambda: AsyncCosmosBackend(proxy)  # noqa: E731
    elif kind == "mongomock-motor":
        mock = AsyncMongoMockClient()["docoutbox"][name]
        async_factory = lambda: AsyncMongoBackend(mock)  # noqa: E731
    else:
        server, flavour = kind.split("-")
        uri = server_uri(server, request)
        if flavour == "sync":
            client: Any = MongoClient(uri, uuidRepresentation="standard")
            closers.append(client.close)
            sync_factory = lambda: MongoBackend(client["docoutbox_test"][name])  # noqa: E731
        else:
            loop = asyncio.new_event_loop()
            if flavour == "motor":
                aclient: Any = AsyncIOMotorClient(uri, io_loop=loop)
                closers.append(aclient.close)
            else:
                aclient = AsyncMongoClient(uri)
                closers.append(lambda: loop.run_until_complete(aclient.close()))  # type: ignore[union-attr]
            async_factory = lambda: AsyncMongoBackend(aclient["docoutbox_test"][name])  # noqa: E731

    if async_factory is not None and loop is None:
        loop = asyncio.new_event_loop()

    def make(model: type[Any], config: StoreConfig | None = None) -> Any:
        if sync_factory is not None:
            return AggregateStore(sync_factory(), model, config)
        assert async_factory is not None and loop is not None
        return BlockingStore(AsyncAggregateStore(async_factory(), model, config), loop)

    yield make
    for close in closers:
        close()
    if loop is not None:
        loop.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A loud summary of every skipped test, grouped by reason, so that a green run that
    left whole layers out (no server, no broker) cannot pass unnoticed."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    write = terminalreporter.write_line
    terminalreporter.section(f"SKIPPED: {len(skipped)} tests did not run", sep="!", red=True)
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        write(f"  {count:5d} x {reason}", red=True)
    if not REQUIRE_SERVERS:
        write(
            "  These parts are untested in this run. Set CI=1 (or "
            "DOCOUTBOX_REQUIRE_SERVERS=1) to make a missing server fail the run.",
            yellow=True,
        )
