"""The dispatcher on the MongoDB wire server: change stream, checkpoints, sweeps, dead letters."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox import AggregateStore, OutboxMessage
from docoutbox.dispatch.aio import AsyncDispatcher
from docoutbox.dispatch.dispatcher import Dispatcher, DispatcherConfig
from docoutbox.dispatch.flow import DispatchPolicy
from docoutbox.dispatch.ownership import Ownership
from docoutbox.errors import ChangeStreamLost, PublishError
from docoutbox.retry import Backoff
from docoutbox.testing import AsyncMemoryPublisher, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_mongo import (
    AsyncMongoBackend,
    AsyncMongoChangeSource,
    AsyncMongoCheckpoints,
    AsyncMongoDeadLetters,
    MongoBackend,
    MongoChangeSource,
    MongoCheckpoints,
    MongoDeadLetters,
)

pytestmark = pytest.mark.wire

CONFIG = DispatcherConfig(
    name="disp",
    concurrency=4,
    sweep_interval=3600,  # no periodic sweep: only the stream and the recovery sweeps
    poll_interval=0.01,
    checkpoint_interval=0.05,
    policy=DispatchPolicy(max_attempts=2, base_delay=0.001, max_delay=0.005),
    backoff=Backoff(base=0.01, cap=0.2),
)


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


class Env:
    """One fresh database on the wire server, and dispatchers started over it by one of
    the drivers: threaded (pymongo), asyncio on ``AsyncMongoClient``, asyncio on Motor."""

    def __init__(self, uri: str, driver: str = "threaded") -> None:
        self.uri = uri
        self.driver = driver
        self.client: MongoClient[Any] = MongoClient(uri, uuidRepresentation="standard")
        self.db = self.client[f"disp_{uuid.uuid4().hex[:10]}"]
        self.coll = self.db["aggs"]
        self.store = AggregateStore(MongoBackend(self.coll), Counter)
        self.running: list[tuple[Dispatcher | AsyncDispatcher, threading.Thread]] = []

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        outcome = self.store.handle(
            aggregate, add_msg(message_id, emits=emits), counter_handlers, create=True
        )
        assert outcome.applied

    def start(
        self,
        publisher: Any,
        *,
        ownership: Ownership | None = None,
        config: DispatcherConfig = CONFIG,
        margin: float = 2.0,
    ) -> Dispatcher | AsyncDispatcher:
        if self.driver != "threaded":
            return self._start_async(publisher, ownership, config, margin)
        dispatcher = Dispatcher(
            MongoBackend(self.coll),
            publisher,
            MongoDeadLetters(self.db["dead"]),
            source=MongoChangeSource(self.coll, margin=margin),
            checkpoints=MongoCheckpoints(self.db["checkpoints"]),
            ownership=ownership,
            config=config,
        )
        thread = threading.Thread(target=dispatcher.run, daemon=True)
        thread.start()
        assert dispatcher.started.wait(10)
        self.running.append((dispatcher, thread))
        return dispatcher

    def _start_async(
        self, publisher: Any, ownership: Ownership | None, config: DispatcherConfig, margin: float
    ) -> AsyncDispatcher:
        made: list[AsyncDispatcher] = []

        async def main() -> None:
            client = async_client(self.driver, self.uri)
            db = client[self.db.name]
            coll = db["aggs"]
            dispatcher = AsyncDispatcher(
                AsyncMongoBackend(coll),
                AsyncMemoryPublisher(publisher),
                AsyncMongoDeadLetters(db["dead"]),
                source=AsyncMongoChangeSource(coll, margin=margin),
                checkpoints=AsyncMongoCheckpoints(db["checkpoints"]),
                ownership=ownership,
                config=config,
            )
            made.append(dispatcher)
            try:
                await dispatcher.run()
            finally:
                closed = client.close()
                if inspect.isawaitable(closed):
                    await closed

        thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        thread.start()
        wait_until(lambda: (bool(made) and made[0].started.is_set()) or not thread.is_alive())
        assert made and made[0].started.is_set()
        self.running.append((made[0], thread))
        return made[0]

    def stop(self, dispatcher: Dispatcher | AsyncDispatcher, *, crash: bool = False) -> None:
        for d, thread in self.running:
            if d is dispatcher:
                d.halt() if crash else d.stop()
                thread.join(15)
                assert not thread.is_alive()

    def pending(self) -> int:
        return sum(len(d["outbox"]) for d in self.coll.find({"outbox.0": {"$exists": True}}))

    def emitted(self) -> dict[str, list[int]]:
        return {d["_id"]: list(range(1, d["outbox_seq"] + 1)) for d in self.coll.find()}

    def checkpoint(self) -> Any:
        doc = self.db["checkpoints"].find_one({"_id": CONFIG.name})
        return None if doc is None else doc["token"]

    def close(self) -> None:
        for d, thread in self.running:
            d.stop()
            thread.join(15)
        self.client.drop_database(self.db.name)
        self.client.close()


def async_client(driver: str, uri: str) -> Any:
    if driver == "motor":
        from motor.motor_asyncio import AsyncIOMotorClient

        return AsyncIOMotorClient(uri, uuidRepresentation="standard")
    from pymongo import AsyncMongoClient

    return AsyncMongoClient(uri, uuidRepresentation="standard")


@pytest.fixture(params=["threaded", "pymongo-async", "motor"])
def env(mongo_uri: str, request: pytest.FixtureRequest) -> Iterator[Env]:
    e = Env(mongo_uri, request.param)
    yield e
    e.close()


def seqs_by_aggregate(entries: list[OutboxMessage]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        seqs[str(entry.aggregate_id)].append(entry.seq)
    return dict(seqs)


def test_stream_publishes_in_order_trims_and_checkpoints(env: Env) -> None:
    publisher = MemoryPublisher()
    dispatcher = env.start(publisher)
    for i in range(40):
        env.write(f"a{i % 6}", f"m{i}", emits=2)
    wait_until(lambda: env.pending() == 0 and len(publisher.published) == 80)
    env.stop(dispatcher)
    assert seqs_by_aggregate(publisher.published) == env.emitted()
    token = env.checkpoint()
    assert set(token) == {"resume_after"}

    # Entries committed while no dispatcher runs are found by resuming from the
    # checkpoint (a single instance does not sweep when it has a usable checkpoint).
    for i in range(10):
        env.write(f"b{i % 3}", f"n{i}")
    second = MemoryPublisher()
    env.start(second)
    wait_until(lambda: env.pending() == 0)
    assert sorted(e.aggregate_id for e in second.published) == sorted(
        f"b{i % 3}" for i in range(10)
    )


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param({"resume_after": {"_data": "garbage"}}, id="malformed-token"),
        pytest.param({"resume_after": {"_data": "ffffffffffffffff"}}, id="overflowing-token"),
        pytest.param("not a position", id="wrong-shape"),
        pytest.param(None, id="deleted"),
    ],
)
def test_a_lost_stream_position_is_recovered_by_a_sweep(env: Env, damage: Any) -> None:
    publisher = MemoryPublisher()
    dispatcher = env.start(publisher)
    env.write("a", "m0")
    wait_until(lambda: env.pending() == 0 and env.checkpoint() is not None)
    env.stop(dispatcher)
    for i in range(12):
        env.write(f"p{i % 4}", f"while-down-{i}")
    # A fresh stream starts at the current second (margin 0): only the sweep can see
    # the entries written while no dispatcher ran.
    time.sleep(1.05)
    if damage is None:
        env.db["checkpoints"].delete_one({"_id": CONFIG.name})
    else:
        env.db["checkpoints"].update_one({"_id": CONFIG.name}, {"$set": {"token": damage}})
    recovered = MemoryPublisher()
    env.start(recovered, margin=0)
    wait_until(lambda: env.pending() == 0)
    assert sorted(e.seq for e in recovered.published if e.aggregate_id == "p0") == [1, 2, 3]
    assert len(recovered.published) == 12
    # The stream works again from the fresh position, and the position is saved.
    env.write("after", "m-after")
    wait_until(lambda: env.pending() == 0)
    wait_until(lambda: env.checkpoint() not in (None, damage))


def test_unresumable_positions_are_classified_as_stream_loss(env: Env) -> None:
    source = MongoChangeSource(env.coll)
    for bad in [{"resume_after": {"_data": "garbage"}}, {"resume_after": {}}, {"x": 1}, 42]:
        with pytest.raises(ChangeStreamLost):
            source.open(bad)
    marker = source.start_marker()
    source.open(marker)
    env.write("a", "m0")
    wait_until(lambda: bool(events := source.poll(10)) and events[0].document is not None)
    source.close()


def test_a_poison_entry_goes_to_the_dead_letter_collection(env: Env) -> None:
    def refuse(entry: OutboxMessage) -> BaseException | None:
        return PublishError("refused by the broker") if entry.payload.get("n") == 13 else None

    publisher = MemoryPublisher(fail=refuse)
    env.start(publisher)
    env.write("a", "m0")
    env.store.handle("a", add_msg("poison", n=13), counter_handlers)
    env.write("a", "m2")
    env.write("b", "m3")
    wait_until(lambda: env.pending() == 0)
    [dead] = list(env.db["dead"].find())
    assert dead["aggregate_id"] == "a" and dead["entry"]["seq"] == 2
    assert "refused by the broker" in dead["error"] and dead["attempts"] == 2
    assert dead["_id"] == dead["entry"]["id"]
    assert seqs_by_aggregate(publisher.published) == {"a": [1, 3], "b": [1]}
    # Idempotent by entry id.
    MongoDeadLetters(env.db["dead"]).put("a", dead["entry"], "again", 9)
    assert env.db["dead"].count_documents({}) == 1
