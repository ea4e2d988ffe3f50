"""Inbox spill-over on the real drivers: an aggregate that has handled more distinct
messages than its window holds still recognises every redelivery, on MongoDB (the wire
server) and Cosmos DB (the local server), sync and async."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from benchmarks import spill as spill_benchmark
from benchmarks.common import Scale
from benchmarks.servers import CosmosAccount, MongoWireServer
from docoutbox import AggregateStore, AsyncAggregateStore, InboxPolicy, StoreConfig
from docoutbox.errors import InvalidConfig
from docoutbox.ports.kit import StoreSettings
from docoutbox.store.spill import SPILL
from docoutbox.testing.blocking import BlockingStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend
from docoutbox_cosmos.aio import open_async_kit
from docoutbox_cosmos.archive import archive_name as cosmos_archive_name
from docoutbox_cosmos.archive import ensure_archive
from docoutbox_cosmos.kit import archive_option, open_kit
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.archive import archive_name as mongo_archive_name
from tests.support.backends import PATIENT
from tests.support.cosmos import async_container, create_container, scratch_database

KINDS = ["wire-sync", "wire-async", "cosmos-sync", "cosmos-aio"]
POLICY = InboxPolicy(window=6, spill=True)
MESSAGES = 40


class Setup:
    """Stores of one kind over one fresh collection (or container) and its archive.

    ``make`` returns a sync store (an async one behind a BlockingStore); ``race`` hands
    each of several new stores its list of messages, all at once (threads, or tasks on
    the async stores' loop)."""

    def __init__(
        self,
        make: Callable[[], Any],
        archived: Callable[[], set[str]],
        raw: Callable[[], dict[str, Any]],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.make = make
        self.archived = archived
        self.raw = raw
        self.loop = loop

    def race(self, orders: list[list[str]]) -> None:
        stores = [self.make() for _ in orders]
        if self.loop is None:
            errors: list[BaseException] = []

            def work(store: Any, order: list[str]) -> None:
                try:
                    for message_id in order:
                        store.handle("a", add_msg(message_id), counter_handlers)
                except BaseException as exc:
                    errors.append(exc)

            threads = [
                threading.Thread(target=work, args=p) for p in zip(stores, orders, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            return

        async def work_async(store: Any, order: list[str]) -> None:
            for message_id in order:
                await store.handle("a", add_msg(message_id), counter_handlers)

        async def all_of() -> None:
            await asyncio.gather(
                *(work_async(s._store, o) for s, o in zip(stores, orders, strict=True))
            )

        self.loop.run_until_complete(all_of())


@pytest.fixture(params=KINDS)
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    kind: str = request.param
    name = f"t_{uuid.uuid4().hex[:12]}"
    config = StoreConfig(inbox=POLICY, retry=PATIENT.retry, cache_size=0)
    with ExitStack() as stack:
        if kind.startswith("wire"):
            request.applymarker(pytest.mark.wire)
            server: MongoWireServer = request.getfixturevalue("wire_server")
            client: Any = MongoClient(server.uri, uuidRepresentation="standard")
            stack.callback(client.close)
            database = client["docoutbox_test"]
            stack.callback(database.drop_collection, name)
            stack.callback(database.drop_collection, mongo_archive_name(name))

            def mongo_archived() -> set[str]:
                return {d["message_id"] for d in database[mongo_archive_name(name)].find()}

            def mongo_raw() -> dict[str, Any]:
                found: dict[str, Any] = database[name].find_one({"_id": "a"})
                return found

            if kind == "wire-sync":
                yield Setup(
                    lambda: AggregateStore(MongoBackend(database[name]), Counter, config),
                    mongo_archived,
                    mongo_raw,
                )
                return
            loop = asyncio.new_event_loop()
            stack.callback(loop.close)
            aclient: Any = AsyncMongoClient(server.uri)
            stack.callback(lambda: loop.run_until_complete(aclient.close()))
            yield Setup(
                lambda: BlockingStore(
                    AsyncAggregateStore(
                        AsyncMongoBackend(aclient["docoutbox_test"][name]), Counter, config
                    ),
                    loop,
                ),
                mongo_archived,
                mongo_raw,
                loop,
            )
            return
        request.applymarker(pytest.mark.cosmos)
        account: CosmosAccount = request.getfixturevalue("cosmos_server")
        db = stack.enter_context(scratch_database(account))
        container = create_container(db)
        archive = ensure_archive(db, cosmos_archive_name(container.id))

        def cosmos_archived() -> set[str]:
            items = archive.query_items("SELECT * FROM c", enable_cross_partition_query=True)
            return {item["message_id"] for item in items}

        def cosmos_raw() -> dict[str, Any]:
            found: dict[str, Any] = container.read_item("a", "a")
            return found

        if kind == "cosmos-sync":
            yield Setup(
                lambda: AggregateStore(
                    CosmosBackend(container, inbox_archive=archive), Counter, config
                ),
                cosmos_archived,
                cosmos_raw,
            )
            return
        loop = asyncio.new_event_loop()
        stack.callback(loop.close)
        proxy, close = async_container(account, db.id, container.id, loop)
        stack.callback(close)
        archive_proxy, close_archive = async_container(account, db.id, archive.id, loop)
        stack.callback(close_archive)
        yield Setup(
            lambda: BlockingStore(
                AsyncAggregateStore(
                    AsyncCosmosBackend(proxy, inbox_archive=archive_proxy), Counter, config
                ),
                loop,
            ),
            cosmos_archived,
            cosmos_raw,
            loop,
        )


def test_every_redelivery_is_recognised_past_the_window(setup: Setup) -> None:
    store = setup.make()
    ids = [f"m{i}" for i in range(MESSAGES)]
    for message_id in ids:
        assert store.handle("a", add_msg(message_id), counter_handlers, create=True).applied
    snapshot = store.get("a")
    assert len(snapshot.inbox) <= POLICY.window
    assert set(snapshot.inbox) | setup.archived() == set(ids)
    for message_id in reversed(ids):
        assert store.handle("a", add_msg(message_id), counter_handlers).duplicate, message_id
    batch = store.handle_batch("a", [add_msg(i) for i in [*ids, "new"]], counter_handlers)
    assert [r.status for r in batch.results] == ["duplicate"] * MESSAGES + ["applied"]
    after = store.get("a")
    assert after.state.total == MESSAGES + 1
    assert after.state.applied == [*ids, "new"]


def test_two_stores_racing_on_redeliveries_apply_each_message_once(setup: Setup) -> None:
    """Two stores (two processes, as far as the database can tell) handle the same
    messages in different orders while the window spills: each message applies once."""
    first = setup.make()
    ids = [f"m{i}" for i in range(24)]
    first.handle("a", add_msg("seed"), counter_handlers, create=True)
    setup.race([ids, list(reversed(ids))])
    for message_id in ids:
        assert first.handle("a", add_msg(message_id), counter_handlers).duplicate
    state = first.get("a").state
    assert sorted(state.applied) == sorted(["seed", *ids])
    assert state.total == len(ids) + 1


def test_the_document_records_the_spill(setup: Setup) -> None:
    store = setup.make()
    for i in range(POLICY.window + 1):
        store.handle("a", add_msg(f"m{i}"), counter_handlers, create=True)
    assert setup.archived() == {"m0", "m1", "m2", "m3"}
    spill = setup.raw()[SPILL]
    assert spill["count"] == 4
    # Cosmos DB: the session token of the archive write (the local server sends none).
    assert spill["token"] is None or isinstance(spill["token"], str)


@pytest.mark.cosmos
def test_a_cosmos_kit_opens_the_archive_when_asked(cosmos_server: CosmosAccount) -> None:
    settings = StoreSettings("https://x", "db", "orders", options={"inbox_archive": "1"})
    assert archive_option(settings) == "orders.inbox"
    assert archive_option(StoreSettings("https://x", "db", "orders")) is None
    named = StoreSettings("https://x", "db", "orders", options={"inbox_archive": "ids"})
    assert archive_option(named) == "ids"
    with scratch_database(cosmos_server) as db:
        create_container(db, "orders")
        options = dict(cosmos_server.client_kwargs)
        plain = open_kit(
            cosmos_server.endpoint, cosmos_server.key, db.id, "orders", client_options=options
        )
        try:
            with pytest.raises(InvalidConfig, match="inbox archive"):
                AggregateStore(plain.backend, Counter, StoreConfig(inbox=POLICY))
        finally:
            plain.close()
        kit = open_kit(
            cosmos_server.endpoint,
            cosmos_server.key,
            db.id,
            "orders",
            client_options=options,
            inbox_archive="orders.inbox",
        )
        try:
            store = AggregateStore(kit.backend, Counter, StoreConfig(inbox=POLICY))
            for i in range(10):
                store.handle("a", add_msg(f"m{i}"), counter_handlers, create=True)
            assert store.handle("a", add_msg("m0"), counter_handlers).duplicate
        finally:
            kit.close()


@pytest.mark.cosmos
def test_an_async_cosmos_kit_opens_the_archive_when_asked(cosmos_server: CosmosAccount) -> None:
    with scratch_database(cosmos_server) as db:
        create_container(db, "orders")

        async def scenario() -> bool:
            kit = await open_async_kit(
                cosmos_server.endpoint,
                cosmos_server.key,
                db.id,
                "orders",
                client_options=dict(cosmos_server.client_kwargs),
                inbox_archive="orders.inbox",
            )
            try:
                store = AsyncAggregateStore(kit.backend, Counter, StoreConfig(inbox=POLICY))
                for i in range(10):
                    await store.handle("a", add_msg(f"m{i}"), counter_handlers, create=True)
                return (await store.handle("a", add_msg("m0"), counter_handlers)).duplicate
            finally:
                await kit.close()

        assert asyncio.run(scenario())


@pytest.mark.wire
def test_the_spill_benchmark_runs(wire_server: MongoWireServer) -> None:
    """A tiny run of ``benchmarks/spill.py`` (nothing here looks at speed)."""
    table = spill_benchmark.run(wire_server.uri, Scale.quick())
    assert [row[:2] for row in table.rows] == [
        ["redelivery", "window"],
        ["redelivery", "spill, spilled"],
        ["new message", "window"],
        ["new message", "spill, spilled"],
    ]
    assert all(row[2] > 0 for row in table.rows)
