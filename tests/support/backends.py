"""One test bundle per database (MongoDB wire server, Cosmos DB), so that one test checks a
property on every backend: a scratch database with the aggregates' collection, the store
and dispatch ports over it (sync, and async on one event loop), and raw reads of what the
database holds. :class:`DispatchEnv` starts dispatchers over a bundle with any driver.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import AsyncMongoClient, MongoClient

from docoutbox import AggregateStore, OutboxMessage, RetryPolicy, StoreConfig
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.ports.dispatch import Ownership
from docoutbox.retry import Backoff
from docoutbox.testing import AsyncMemoryPublisher, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource
from docoutbox_cosmos.coordination import (
    AsyncCosmosCheckpoints,
    AsyncCosmosDeadLetters,
    CosmosCheckpoints,
    CosmosDeadLetters,
    CosmosLeaseTable,
)
from docoutbox_cosmos.items import encode_id
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource
from docoutbox_mongo.coordination import (
    AsyncMongoCheckpoints,
    AsyncMongoDeadLetters,
    MongoCheckpoints,
    MongoDeadLetters,
    MongoLeaseTable,
)
from tests.support.cosmos import create_container, scratch_database

CONFIG = DispatcherConfig(
    name="disp",
    concurrency=4,
    sweep_interval=3600,  # no periodic sweep: only the stream and the recovery sweeps
    poll_interval=0.01,
    checkpoint_interval=0.05,
    policy=DispatchPolicy(max_attempts=2, base_delay=0.001, max_delay=0.005),
    backoff=Backoff(base=0.01, cap=0.2),
)

#: Writers of the contention tests, and a store that outwaits them.
THREADS = 8
PER_THREAD = 200
PATIENT = StoreConfig(retry=RetryPolicy(max_attempts=100_000, base_delay=0.0005, max_delay=0.02))


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def seqs_by_aggregate(entries: list[OutboxMessage]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        seqs[str(entry.aggregate_id)].append(entry.seq)
    return dict(seqs)


@dataclass
class Ports:
    """What a dispatcher is built from, all of one flavour (sync or async)."""

    backend: Any
    dead_letters: Any
    source: Any
    checkpoints: Any


class Bundle:
    """A scratch database on one backend's session server; subclasses say how to reach it."""

    #: "mongo" or "cosmos".
    kind = ""
    #: The async drivers of this backend's ports (see :meth:`async_ports`).
    async_drivers: tuple[str, ...] = ()
    #: The field of a dead-letter record that holds the entry ID.
    dead_id_field = ""
    #: True when a recovered position publishes exactly what was written while down.
    exact_recovery = True
    #: Source options and a pause that make a fresh stream start after earlier writes.
    fresh_start_options: ClassVar[dict[str, Any]] = {}
    fresh_start_delay = 0.0
    #: The scratch database and the aggregates' collection (container), as the SDK has them.
    db: Any
    coll: Any

    def __init__(self) -> None:
        self.charges: list[tuple[str, int, float]] = []
        self.store = AggregateStore(self.store_backend(), Counter)

    # -- the store -------------------------------------------------------------------

    def store_backend(self) -> Any:
        """A new sync store backend over the aggregates' collection."""
        raise NotImplementedError

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        outcome = self.store.handle(
            aggregate, add_msg(message_id, emits=emits), counter_handlers, create=True
        )
        assert outcome.applied

    # -- dispatch ports --------------------------------------------------------------

    def ports(self, **source_options: Any) -> Ports:
        raise NotImplementedError

    async def async_ports(
        self, driver: str, **source_options: Any
    ) -> tuple[Ports, Callable[[], Awaitable[None]]]:
        """Async ports on the running loop, and how to close their client."""
        raise NotImplementedError

    def lease_table(self, group: str) -> Any:
        raise NotImplementedError

    # -- raw reads -------------------------------------------------------------------

    def pending(self) -> int:
        """Entries left in every outbox."""
        raise NotImplementedError

    def emitted(self) -> dict[str, list[int]]:
        """Every aggregate's emitted seqs, 1..outbox_seq."""
        raise NotImplementedError

    def checkpoint(self) -> Any:
        """The stored position of :data:`CONFIG`'s dispatcher, or None."""
        raise NotImplementedError

    def dead_items(self) -> list[dict[str, Any]]:
        """The dead-letter records as stored."""
        raise NotImplementedError

    def damage_checkpoint(self, damage: str) -> None:
        """Break the stored position: ``deleted``, or one of ``DAMAGES``."""
        raise NotImplementedError

    def assert_position(self, position: Any) -> None:
        """``position`` has the shape this backend's change source saves."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class MongoBundle(Bundle):
    kind = "mongo"
    async_drivers = ("pymongo-async", "motor")
    dead_id_field = "_id"
    #: A fresh stream starts at the current second (margin 0).
    fresh_start_options: ClassVar[dict[str, Any]] = {"margin": 0}
    fresh_start_delay = 1.05
    #: A damaged resume token, by name.
    DAMAGES: ClassVar[dict[str, Any]] = {
        "malformed-token": {"resume_after": {"_data": "garbage"}},
        "overflowing-token": {"resume_after": {"_data": "ffffffffffffffff"}},
        "wrong-shape": "not a position",
    }

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client: Any = MongoClient(
            uri, uuidRepresentation="standard", maxPoolSize=THREADS * 2 + 4
        )
        self.db = self.client[f"disp_{uuid.uuid4().hex[:10]}"]
        self.coll = self.db["aggs"]
        super().__init__()

    def store_backend(self) -> Any:
        return MongoBackend(self.coll)

    def ports(self, **source_options: Any) -> Ports:
        return Ports(
            self.store_backend(),
            MongoDeadLetters(self.db["dead"]),
            MongoChangeSource(self.coll, **source_options),
            MongoCheckpoints(self.db["checkpoints"]),
        )

    async def async_ports(
        self, driver: str, **source_options: Any
    ) -> tuple[Ports, Callable[[], Awaitable[None]]]:
        client = mongo_async_client(driver, self.uri)
        db = client[self.db.name]
        coll = db["aggs"]

        async def close() -> None:
            closed = client.close()
            if inspect.isawaitable(closed):
                await closed

        ports = Ports(
            AsyncMongoBackend(coll),
            AsyncMongoDeadLetters(db["dead"]),
            AsyncMongoChangeSource(coll, **source_options),
            AsyncMongoCheckpoints(db["checkpoints"]),
        )
        return ports, close

    def lease_table(self, group: str) -> Any:
        return MongoLeaseTable(self.db["leases"], group)

    def pending(self) -> int:
        return sum(len(d["outbox"]) for d in self.coll.find({"outbox.0": {"$exists": True}}))

    def emitted(self) -> dict[str, list[int]]:
        return {d["_id"]: list(range(1, d["outbox_seq"] + 1)) for d in self.coll.find()}

    def checkpoint(self) -> Any:
        doc = self.db["checkpoints"].find_one({"_id": CONFIG.name})
        return None if doc is None else doc["token"]

    def dead_items(self) -> list[dict[str, Any]]:
        return list(self.db["dead"].find())

    def dead_letters(self) -> Any:
        return self.ports().dead_letters

    def damage_checkpoint(self, damage: str) -> None:
        checkpoints = self.db["checkpoints"]
        if damage == "deleted":
            checkpoints.delete_one({"_id": CONFIG.name})
        else:
            token = self.DAMAGES[damage]
            checkpoints.update_one({"_id": CONFIG.name}, {"$set": {"token": token}})

    def assert_position(self, position: Any) -> None:
        assert set(position) == {"resume_after"}

    def close(self) -> None:
        self.client.drop_database(self.db.name)
        self.client.close()


def mongo_async_client(driver: str, uri: str) -> Any:
    if driver == "motor":
        return AsyncIOMotorClient(uri, uuidRepresentation="standard")

    return AsyncMongoClient(uri, uuidRepresentation="standard")


class CosmosBundle(Bundle):
    kind = "cosmos"
    async_drivers = ("asyncio",)
    dead_id_field = "entry_id"
    #: Recovery is checked on the entries written while down only.
    exact_recovery = False
    DAMAGES: ClassVar[dict[str, Any]] = {
        "malformed-continuation": None,  # one range's continuation, in place
        "other-feed-ranges": {"v": 1, "ranges": {"x": "y"}},
    }

    def __init__(self, account: Any) -> None:
        self.account = account
        self._stack = ExitStack()
        self.db = self._stack.enter_context(scratch_database(account))
        self.coll = create_container(self.db, "aggs")
        self.checkpoints = create_container(self.db, "checkpoints")
        self.dead = create_container(self.db, "dead")
        self.leases = create_container(self.db, "leases")
        super().__init__()

    def store_backend(self) -> Any:
        return CosmosBackend(self.coll, on_charge=lambda *c: self.charges.append(c))

    def ports(self, **source_options: Any) -> Ports:
        return Ports(
            self.store_backend(),
            CosmosDeadLetters(self.dead),
            CosmosChangeSource(self.coll, **source_options),
            CosmosCheckpoints(self.checkpoints),
        )

    async def async_ports(
        self, driver: str, **source_options: Any
    ) -> tuple[Ports, Callable[[], Awaitable[None]]]:
        client = self.account.async_client()
        db = client.get_database_client(self.db.id)
        aggs = db.get_container_client(self.coll.id)
        ports = Ports(
            AsyncCosmosBackend(aggs),
            AsyncCosmosDeadLetters(db.get_container_client(self.dead.id)),
            AsyncCosmosChangeSource(aggs, **source_options),
            AsyncCosmosCheckpoints(db.get_container_client(self.checkpoints.id)),
        )
        return ports, client.close

    def lease_table(self, group: str) -> Any:
        return CosmosLeaseTable(self.leases, group)

    def _query(self, container: Any, sql: str) -> list[Any]:
        return list(container.query_items(sql, enable_cross_partition_query=True))

    def pending(self) -> int:
        return sum(self._query(self.coll, "SELECT VALUE ARRAY_LENGTH(c.outbox) FROM c"))

    def emitted(self) -> dict[str, list[int]]:
        rows = self._query(self.coll, "SELECT c.aid, c.outbox_seq FROM c")
        return {r["aid"]: list(range(1, r["outbox_seq"] + 1)) for r in rows}

    def checkpoint(self) -> Any:
        return CosmosCheckpoints(self.checkpoints).load(CONFIG.name)

    def dead_items(self) -> list[dict[str, Any]]:
        return self._query(self.dead, "SELECT * FROM c")

    def dead_letters(self) -> Any:
        return self.ports().dead_letters

    def damage_checkpoint(self, damage: str) -> None:
        checkpoints = CosmosCheckpoints(self.checkpoints)
        if damage == "deleted":
            item_id = encode_id(CONFIG.name)
            self.checkpoints.delete_item(item_id, partition_key=item_id)
        elif damage == "malformed-continuation":
            saved = self.checkpoint()
            key = next(iter(saved["ranges"]))
            checkpoints.save(CONFIG.name, {"v": 1, "ranges": {**saved["ranges"], key: "garbage"}})
        else:
            checkpoints.save(CONFIG.name, self.DAMAGES[damage])

    def assert_position(self, position: Any) -> None:
        ranges = list(self.coll.read_feed_ranges())
        assert position["v"] == 1 and len(position["ranges"]) == len(ranges)

    def close(self) -> None:
        self._stack.close()


#: (backend, driver) of the dispatch tests: every driver of each backend.
DISPATCH_DRIVERS = [
    pytest.param(("mongo", "threaded"), id="mongo-threaded", marks=pytest.mark.wire),
    pytest.param(("mongo", "pymongo-async"), id="mongo-pymongo-async", marks=pytest.mark.wire),
    pytest.param(("mongo", "motor"), id="mongo-motor", marks=pytest.mark.wire),
    pytest.param(("cosmos", "threaded"), id="cosmos-threaded", marks=pytest.mark.cosmos),
    pytest.param(("cosmos", "asyncio"), id="cosmos-asyncio", marks=pytest.mark.cosmos),
]
#: One case per backend, for the tests that need no dispatcher driver.
BACKENDS = [
    pytest.param("mongo", id="mongo", marks=pytest.mark.wire),
    pytest.param("cosmos", id="cosmos", marks=pytest.mark.cosmos),
]


def open_bundle(kind: str, request: pytest.FixtureRequest) -> Bundle:
    """A bundle on the session's server of ``kind`` (each server started once)."""
    if kind == "mongo":
        return MongoBundle(request.getfixturevalue("mongo_uri"))
    return CosmosBundle(request.getfixturevalue("cosmos_server"))


@contextmanager
def bundle_of(kind: str, request: pytest.FixtureRequest) -> Iterator[Bundle]:
    bundle = open_bundle(kind, request)
    try:
        yield bundle
    finally:
        bundle.close()


@contextmanager
def dispatch_env_of(
    kind: str, request: pytest.FixtureRequest, driver: str = "threaded"
) -> Iterator[DispatchEnv]:
    """A :class:`DispatchEnv` over a fresh bundle; its dispatchers stopped afterwards."""
    with bundle_of(kind, request) as bundle:
        env = DispatchEnv(bundle, driver)
        try:
            yield env
        finally:
            env.close()


class DispatchEnv:
    """Dispatchers started over one bundle by one driver: threaded, or asyncio on the
    bundle's async ports (``pymongo-async``, ``motor`` or ``asyncio`` for Cosmos DB)."""

    def __init__(self, bundle: Bundle, driver: str = "threaded") -> None:
        self.bundle = bundle
        self.driver = driver
        self.store = bundle.store
        self.db = bundle.db
        self.coll = bundle.coll
        self.running: list[tuple[Dispatcher | AsyncDispatcher, threading.Thread]] = []

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        self.bundle.write(aggregate, message_id, emits)

    def start(
        self,
        publisher: Any,
        *,
        ownership: Ownership | None = None,
        config: DispatcherConfig = CONFIG,
        source: Any = None,
        checkpoints: Any = None,
        **source_options: Any,
    ) -> Dispatcher | AsyncDispatcher:
        """A running dispatcher. ``source`` and ``checkpoints`` (sync ports) replace the
        bundle's; the asyncio drivers call them, and a publisher other than a
        :class:`MemoryPublisher`, in a thread."""
        if self.driver != "threaded":
            return self._start_async(
                publisher, ownership, config, source, checkpoints, source_options
            )
        ports = self.bundle.ports(**source_options)
        dispatcher = Dispatcher(
            ports.backend,
            publisher,
            ports.dead_letters,
            source=ports.source if source is None else source,
            checkpoints=ports.checkpoints if checkpoints is None else checkpoints,
            ownership=ownership,
            config=config,
        )
        thread = threading.Thread(target=dispatcher.run, daemon=True)
        thread.start()
        assert dispatcher.started.wait(10)
        self.running.append((dispatcher, thread))
        return dispatcher

    def _start_async(
        self,
        publisher: Any,
        ownership: Ownership | None,
        config: DispatcherConfig,
        source: Any,
        checkpoints: Any,
        source_options: dict[str, Any],
    ) -> AsyncDispatcher:
        made: list[AsyncDispatcher] = []

        async def main() -> None:
            ports, close = await self.bundle.async_ports(self.driver, **source_options)
            dispatcher = AsyncDispatcher(
                ports.backend,
                AsyncMemoryPublisher(publisher)
                if isinstance(publisher, MemoryPublisher)
                else in_thread(publisher),
                ports.dead_letters,
                source=ports.source if source is None else in_thread(source),
                checkpoints=ports.checkpoints if checkpoints is None else in_thread(checkpoints),
                ownership=ownership,
                config=config,
            )
            made.append(dispatcher)
            try:
                await dispatcher.run()
            finally:
                await close()

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
        return self.bundle.pending()

    def emitted(self) -> dict[str, list[int]]:
        return self.bundle.emitted()

    def checkpoint(self) -> Any:
        return self.bundle.checkpoint()

    def close(self) -> None:
        for d, thread in self.running:
            d.stop()
            thread.join(15)


def owned(dispatcher: Dispatcher | AsyncDispatcher) -> frozenset[int]:
    scope = dispatcher.ownership.owned()
    assert scope is not None
    return scope


class OverlapDetector:
    """Shared by every instance's publisher: flags one aggregate published by two at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[Any, tuple[str, int]] = {}
        self.overlaps: list[tuple[Any, str, str]] = []
        self.log: list[tuple[str, OutboxMessage, float]] = []

    def publisher(self, instance: str) -> InstancePublisher:
        return InstancePublisher(self, instance)

    def assert_each_published_in_order(self, emitted: dict[str, list[int]]) -> None:
        """No overlap, every emitted entry published (I1), and each instance published
        each aggregate's entries in order and never twice (I4)."""
        assert self.overlaps == []
        published = {(e.aggregate_id, e.seq) for _, e, _ in self.log}
        assert published == {(agg, seq) for agg, seqs in emitted.items() for seq in seqs}
        by_instance: dict[tuple[str, Any], list[int]] = defaultdict(list)
        for instance, entry, _ in self.log:
            by_instance[(instance, entry.aggregate_id)].append(entry.seq)
        for seqs in by_instance.values():
            assert seqs == sorted(set(seqs))


class InstancePublisher:
    def __init__(self, detector: OverlapDetector, instance: str) -> None:
        self.d = detector
        self.instance = instance

    def publish(self, entry: OutboxMessage) -> None:
        key = entry.aggregate_id
        with self.d.lock:
            holder, count = self.d.active.get(key, (self.instance, 0))
            if holder != self.instance:
                self.d.overlaps.append((key, holder, self.instance))
            self.d.active[key] = (self.instance, count + 1 if holder == self.instance else 1)
        time.sleep(0.002)
        with self.d.lock:
            holder, count = self.d.active.get(key, (self.instance, 1))
            if count <= 1:
                self.d.active.pop(key, None)
            else:
                self.d.active[key] = (holder, count - 1)
            self.d.log.append((self.instance, entry, time.monotonic()))


class Trimmer(threading.Thread):
    """Publishes (records) whatever is pending and trims it, until told to stop."""

    def __init__(self, store: AggregateStore[Counter]) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.published: dict[str, int] = {}
        self.trims = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.drain()
            self.drain()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def drain(self) -> None:
        snapshot = self.store.get("hot")
        batch = [(e.id, e.seq) for e in snapshot.outbox]
        if batch:
            self.published.update(batch)
            assert self.store.trim("hot", [entry_id for entry_id, _ in batch])
            self.trims += 1


def run_writers(store_for: Any, threads: int, per_thread: int) -> list[Any]:
    """``threads`` threads each handling ``per_thread`` messages on aggregate "hot"."""
    outcomes: list[Any] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        store = store_for()
        try:
            for i in range(per_thread):
                outcome = store.handle("hot", add_msg(f"w{worker}-{i}"), counter_handlers)
                with lock:
                    outcomes.append(outcome)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    return outcomes
