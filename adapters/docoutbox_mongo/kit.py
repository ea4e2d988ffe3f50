"""The MongoDB kit: everything a dispatcher needs from one URI, opened from plain
arguments (:func:`open_kit`, :func:`open_async_kit`), and :data:`STORE`, the adapter the
``docoutbox.stores`` entry point names."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from docoutbox.dispatch.engine.backlog import OutboxStats
from docoutbox.dispatch.engine.lag import PendingWork
from docoutbox.errors import PermanentStoreError
from docoutbox.ports.kit import StoreSettings, name_problem
from docoutbox_mongo.admin import outbox_stats, pending_work
from docoutbox_mongo.backend import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource
from docoutbox_mongo.coordination import (
    AsyncMongoCheckpoints,
    AsyncMongoDeadLetters,
    MongoCheckpoints,
    MongoDeadLetters,
    MongoLeaseTable,
)
from docoutbox_mongo.errors import translated
from docoutbox_mongo.payloads import AsyncMongoPayloads, MongoPayloads, payloads_collection

#: Seconds to reach the server when neither the caller nor the URI says.
DEFAULT_TIMEOUT = 5.0


def client_options(uri: str, timeout: float | None, appname: str) -> dict[str, Any]:
    """Keyword options for a client of ``uri``.

    pymongo lets keywords override the URI's options, so only what the caller asked for
    (``timeout``, in seconds) or what the URI leaves unset is passed: a URI's
    ``serverSelectionTimeoutMS``, ``connectTimeoutMS`` and ``appName`` are kept.
    """
    given = {
        part.split("=", 1)[0].strip().lower()
        for part in re.split("[&;]", uri.partition("?")[2])
        if part
    }
    options: dict[str, Any] = {"uuidRepresentation": "standard"}
    ms = max(1, int((DEFAULT_TIMEOUT if timeout is None else timeout) * 1000))
    for name in ("serverSelectionTimeoutMS", "connectTimeoutMS"):
        if timeout is not None or name.lower() not in given:
            options[name] = ms
    if "appname" not in given:
        options["appname"] = appname
    return options


@dataclass
class MongoKit:
    """A :class:`~docoutbox.ports.kit.StoreKit` on one collection, and its client."""

    client: Any
    backend: MongoBackend
    source: MongoChangeSource
    checkpoints: MongoCheckpoints
    leases: MongoLeaseTable
    dead_letters: MongoDeadLetters

    @property
    def payloads(self) -> MongoPayloads:
        """The claim check's payload store: the side collection ``<collection>_payloads``
        (:class:`~docoutbox.ports.payloads.PayloadKit`)."""
        coll = self.backend.collection
        return MongoPayloads(coll.database[payloads_collection(coll.name)])

    def ensure_indexes(self) -> None:
        """Create the indexes of the collection, of its claim check's payloads and of the
        dead letters (idempotent; a set-up step, never done on open)."""
        self.backend.ensure_indexes()
        self.payloads.ensure_indexes()
        self.dead_letters.ensure_indexes()

    def outbox_stats(self) -> OutboxStats:
        """The backlog, in one query (a projection of the pending documents)."""
        return outbox_stats(self.backend.collection)

    def pending_work(self, partitions: int | None = None) -> PendingWork:
        """Pending entries per stored partition, in one aggregation
        (:func:`~docoutbox_mongo.admin.pending_work`)."""
        return pending_work(self.backend.collection, partitions)

    def close(self) -> None:
        self.client.close()


def open_kit(
    uri: str,
    db: str,
    collection: str,
    *,
    timeout: float | None = None,
    checkpoints: str = "docoutbox_checkpoints",
    leases: str = "docoutbox_leases",
    dead_letters: str = "docoutbox_dead_letters",
    group: str | None = None,
) -> MongoKit:
    """Open a client and check the server answers within ``timeout`` seconds (None: the
    URI's ``serverSelectionTimeoutMS``, else :data:`DEFAULT_TIMEOUT`).

    Raises :class:`~docoutbox.errors.StoreError` for a bad URI or an unreachable server.
    """
    client, database = connect_database(uri, db, timeout=timeout, appname="docoutbox-dispatch")
    try:
        coll = database[collection]
        return MongoKit(
            client=client,
            backend=MongoBackend(coll),
            source=MongoChangeSource(coll),
            checkpoints=MongoCheckpoints(database[checkpoints]),
            leases=MongoLeaseTable(database[leases], group or collection),
            dead_letters=MongoDeadLetters(database[dead_letters]),
        )
    except BaseException:
        client.close()
        raise


def connect_database(
    uri: str, db: str, *, timeout: float | None = None, appname: str = "docoutbox"
) -> tuple[Any, Any]:
    """A client and its database ``db``, once the server answered a ping within
    ``timeout`` seconds (see :func:`client_options`). Raises
    :class:`~docoutbox.errors.StoreError` otherwise."""
    try:
        with translated():
            client: Any = MongoClient(uri, **client_options(uri, timeout, appname))
    except ValueError as exc:  # pymongo reports some malformed URIs as plain ValueError
        raise PermanentStoreError(f"invalid MongoDB URI: {exc}") from exc
    try:
        with translated():
            database = client[db]
            database.command("ping")
    except BaseException:
        client.close()
        raise
    return client, database


@dataclass
class AsyncMongoKit:
    """An :class:`~docoutbox.ports.kit.AsyncStoreKit` on an async client.

    The lease table stays sync, on its own small client: the lease keeper heartbeats on
    a thread of its own, whatever the event loop is doing.
    """

    client: Any
    lease_client: Any
    backend: AsyncMongoBackend
    source: AsyncMongoChangeSource
    checkpoints: AsyncMongoCheckpoints
    leases: MongoLeaseTable
    dead_letters: AsyncMongoDeadLetters

    @property
    def payloads(self) -> AsyncMongoPayloads:
        """The async twin of :attr:`MongoKit.payloads`."""
        coll = self.backend.collection
        return AsyncMongoPayloads(coll.database[payloads_collection(coll.name)])

    async def ensure_indexes(self) -> None:
        """The async twin of :meth:`MongoKit.ensure_indexes`."""
        await self.backend.ensure_indexes()
        await self.payloads.ensure_indexes()
        await self.dead_letters.ensure_indexes()

    async def close(self) -> None:
        closed = self.client.close()
        if inspect.isawaitable(closed):  # pymongo async; Motor closes synchronously
            await closed
        self.lease_client.close()


async def open_async_kit(
    uri: str,
    db: str,
    collection: str,
    *,
    driver: str = "pymongo",
    timeout: float | None = None,
    checkpoints: str = "docoutbox_checkpoints",
    leases: str = "docoutbox_leases",
    dead_letters: str = "docoutbox_dead_letters",
    group: str | None = None,
) -> AsyncMongoKit:
    """Like :func:`open_kit`, on ``pymongo.AsyncMongoClient`` or Motor (``driver``)."""
    options = client_options(uri, timeout, "docoutbox-dispatch")
    try:
        with translated():
            if driver == "motor":
                from motor.motor_asyncio import AsyncIOMotorClient  # noqa: PLC0415

                client: Any = AsyncIOMotorClient(uri, **options)
            elif driver == "pymongo":
                from pymongo import AsyncMongoClient  # noqa: PLC0415

                client = AsyncMongoClient(uri, **options)
            else:
                raise ValueError(f"unknown async MongoDB driver {driver!r}")
            lease_client: Any = MongoClient(uri, **options)
    except ValueError as exc:
        raise PermanentStoreError(f"invalid MongoDB URI or driver: {exc}") from exc
    try:
        with translated():
            database = client[db]
            await database.command("ping")
        return AsyncMongoKit(
            client=client,
            lease_client=lease_client,
            backend=AsyncMongoBackend(database[collection]),
            source=AsyncMongoChangeSource(database[collection]),
            checkpoints=AsyncMongoCheckpoints(database[checkpoints]),
            leases=MongoLeaseTable(lease_client[db][leases], group or collection),
            dead_letters=AsyncMongoDeadLetters(database[dead_letters]),
        )
    except BaseException:
        lease_client.close()
        closed = client.close()
        if inspect.isawaitable(closed):
            await closed
        raise


class MongoStore:
    """The MongoDB adapter (:class:`~docoutbox.ports.kit.StoreAdapter`).

    :class:`~docoutbox.ports.kit.StoreSettings`: ``url`` is the MongoDB URI; option
    ``driver`` picks the async client (``pymongo``, the default, or ``motor``).
    """

    label = "MongoDB"
    extra = "mongodb"

    def open(self, settings: StoreSettings) -> MongoKit:
        return open_kit(
            settings.url, settings.database, settings.collection, timeout=settings.timeout
        )

    async def open_async(self, settings: StoreSettings) -> AsyncMongoKit:
        return await open_async_kit(
            settings.url,
            settings.database,
            settings.collection,
            driver=settings.options.get("driver", "pymongo"),
            timeout=settings.timeout,
        )

    def name_problem(self, text: str, what: str) -> str | None:
        """Why ``text`` cannot name a MongoDB ``what`` ("database" or "collection")."""
        forbidden = '/\\. "$' if what == "database" else "$"
        return name_problem(text, what, forbidden, reserved=text.startswith("system."))


#: The adapter the ``docoutbox.stores`` entry point ``mongo`` names.
STORE = MongoStore()
