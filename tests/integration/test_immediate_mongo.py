"""Immediate dispatch on the MongoDB wire server, threaded and on asyncio: with the regular
dispatcher (change stream and sweep) in the same process, every committed entry is
published exactly once, in seq order per aggregate, and nothing is left pending."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from docoutbox import AggregateStore, AsyncAggregateStore, AsyncDispatcher, Dispatcher
from docoutbox.dispatch.drivers.aio import in_thread
from docoutbox.dispatch.extras.immediate import AsyncImmediateDispatcher, ImmediateDispatcher
from docoutbox.testing import MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.publisher import AsyncMemoryPublisher
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource
from tests.integration.test_immediate import FAST, in_seq_order

pytestmark = pytest.mark.wire

WRITERS, COMMITS = 4, 25


@pytest.fixture
def names(mongo_uri: str) -> Iterator[tuple[str, str, str]]:
    """A scratch database (dropped afterwards) and its collection, on the test server."""
    name = f"it_{uuid.uuid4().hex[:8]}"
    yield mongo_uri, name, "orders"
    client: Any = MongoClient(mongo_uri)
    client.drop_database(name)
    client.close()


def check(coll: Any, publisher: MemoryPublisher, immediate_published: int) -> None:
    counts = Tally(publisher.ids())
    assert len(counts) == WRITERS * COMMITS, "an entry was not published"
    assert max(counts.values()) == 1, "an entry was published twice"
    assert in_seq_order(publisher.published)
    assert coll.count_documents({"outbox.0": {"$exists": True}}) == 0
    assert immediate_published > 0


def test_threaded(names: tuple[str, str, str]) -> None:
    uri, db, name = names
    client: Any = MongoClient(uri, uuidRepresentation="standard")
    coll = client[db][name]
    store = AggregateStore(MongoBackend(coll), Counter)
    publisher = MemoryPublisher()
    immediate = ImmediateDispatcher(store, publisher).start()
    dispatcher = Dispatcher(
        MongoBackend(coll),
        immediate.guard(publisher),
        MemoryDeadLetters(),
        source=MongoChangeSource(coll),
        config=FAST,
    )
    runner = threading.Thread(target=dispatcher.run, daemon=True)
    runner.start()
    assert dispatcher.started.wait(10)

    def produce(w: int) -> None:
        for i in range(COMMITS):
            store.handle(f"a{w}", add_msg(f"w{w}-{i}"), counter_handlers, create=True)

    writers = [threading.Thread(target=produce, args=(w,)) for w in range(WRITERS)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    immediate.drain()
    deadline = time.monotonic() + 30
    while coll.count_documents({"outbox.0": {"$exists": True}}) and time.monotonic() < deadline:
        time.sleep(0.05)
    dispatcher.stop()
    runner.join(30)
    immediate.stop()
    try:
        check(coll, publisher, immediate.stats.published)
    finally:
        client.close()


def test_asyncio(names: tuple[str, str, str]) -> None:
    """pymongo's AsyncMongoClient: store, immediate path and dispatcher on one loop."""
    uri, db, name = names
    publisher = MemoryPublisher()
    published: list[int] = []

    async def main() -> None:
        client: Any = AsyncMongoClient(uri, uuidRepresentation="standard")
        coll = client[db][name]
        store = AsyncAggregateStore(AsyncMongoBackend(coll), Counter)
        immediate = AsyncImmediateDispatcher(store, AsyncMemoryPublisher(publisher))
        await immediate.start()
        dispatcher = AsyncDispatcher(
            AsyncMongoBackend(coll),
            immediate.guard(AsyncMemoryPublisher(publisher)),
            in_thread(MemoryDeadLetters()),
            source=AsyncMongoChangeSource(coll),
            config=FAST,
        )
        runner = asyncio.get_running_loop().create_task(dispatcher.run())

        async def produce(w: int) -> None:
            for i in range(COMMITS):
                await store.handle(f"a{w}", add_msg(f"w{w}-{i}"), counter_handlers, create=True)

        await asyncio.gather(*(produce(w) for w in range(WRITERS)))
        await immediate.drain()
        deadline = time.monotonic() + 30
        while await coll.count_documents({"outbox.0": {"$exists": True}}):
            assert time.monotonic() < deadline, "entries left pending"
            await asyncio.sleep(0.05)
        dispatcher.stop()
        await runner
        await immediate.stop()
        published.append(immediate.stats.published)
        await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))
    client: Any = MongoClient(uri, uuidRepresentation="standard")
    try:
        check(client[db][name], publisher, published[0])
    finally:
        client.close()
