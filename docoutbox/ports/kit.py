"""Kits: everything a dispatcher needs from one database, opened from plain arguments.

Rule: a database adapter exposes one kit (backend, change source, checkpoints, leases,
dead letters, close), sync and async, built from :class:`StoreSettings`; it never reads
command-line arguments. The application ring finds adapters by the entry point groups
``docoutbox.stores`` (a :class:`StoreAdapter`) and ``docoutbox.brokers`` (a
:class:`BrokerAdapter`), so a third-party adapter plugs in without editing docoutbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from docoutbox.codec import WireFormat
from docoutbox.dispatch.engine.backlog import OutboxStats
from docoutbox.dispatch.engine.lag import PendingWork
from docoutbox.ports.dispatch import (
    AsyncChangeSource,
    AsyncCheckpoints,
    AsyncDeadLetters,
    ChangeSource,
    Checkpoints,
    DeadLetters,
    LeaseTable,
    Publisher,
)
from docoutbox.ports.store import AsyncStoreBackend, StoreBackend


@dataclass(frozen=True)
class StoreSettings:
    """Where a kit's database is, in plain values.

    ``url`` is the adapter's own address (a MongoDB URI, a Cosmos DB endpoint); ``key`` a
    secret that is not in it (a Cosmos DB account key), never printed; ``timeout`` the
    seconds to reach the server (None: the adapter's default); ``options`` the adapter's
    own settings, by name (for example ``ca_file`` for Cosmos DB, ``driver`` for MongoDB).
    """

    url: str
    database: str
    collection: str
    key: str | None = field(default=None, repr=False)
    timeout: float | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class StoreKit(Protocol):
    """The ports a sync dispatcher uses, opened on one collection, and how to close them.

    ``source`` and ``checkpoints`` serve a single instance; a lease table that is a
    :class:`~docoutbox.ports.dispatch.StreamLeases` gives leased instances their own.
    """

    @property
    def backend(self) -> StoreBackend: ...

    @property
    def source(self) -> ChangeSource: ...

    @property
    def checkpoints(self) -> Checkpoints: ...

    @property
    def leases(self) -> LeaseTable: ...

    @property
    def dead_letters(self) -> DeadLetters: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncStoreKit(Protocol):
    """The async twin of :class:`StoreKit`. Its lease table stays sync: the lease keeper
    heartbeats on a thread of its own, whatever the event loop is doing."""

    @property
    def backend(self) -> AsyncStoreBackend: ...

    @property
    def source(self) -> AsyncChangeSource: ...

    @property
    def checkpoints(self) -> AsyncCheckpoints: ...

    @property
    def leases(self) -> LeaseTable: ...

    @property
    def dead_letters(self) -> AsyncDeadLetters: ...

    async def close(self) -> None: ...


@runtime_checkable
class MeasuredKit(Protocol):
    """Optional: a kit that measures its backlog in one query (else the backlog is paged
    through ``find_pending``)."""

    def outbox_stats(self) -> OutboxStats: ...


@runtime_checkable
class PendingWorkKit(Protocol):
    """Optional: a kit that measures the pending work per partition (or feed range) in one
    query, for metrics a scaler reads (:mod:`~docoutbox.dispatch.engine.lag`).
    ``partitions`` is the stored partitions' count where the kit cannot know it."""

    def pending_work(self, partitions: int | None = None) -> PendingWork: ...


@runtime_checkable
class StoreAdapter(Protocol):
    """A database adapter, as the ``docoutbox.stores`` entry point group names it.

    ``open`` and ``open_async`` raise :class:`~docoutbox.errors.StoreError` when the
    database cannot be used (unreachable, refused credentials, a missing collection);
    ``name_problem`` says why a database or collection name cannot be used, or None.
    """

    #: The database's name in messages ("MongoDB").
    label: str
    #: The ``docoutbox`` extra that installs the adapter's driver ("mongodb").
    extra: str

    def open(self, settings: StoreSettings) -> StoreKit: ...

    async def open_async(self, settings: StoreSettings) -> AsyncStoreKit: ...

    def name_problem(self, text: str, what: str) -> str | None:
        """Why ``text`` cannot name a ``what`` ("database" or "collection") of this
        database (see :func:`name_problem`), or None."""
        ...


def name_problem(
    text: str, what: str, forbidden: str = "", *, reserved: bool = False
) -> str | None:
    """The one wording of an unusable name: empty, holding a NUL or one of ``forbidden``,
    or ``reserved`` by the database; None when ``text`` is usable."""
    bad = [c for c in forbidden if c in text]
    if not text or "\x00" in text or bad or reserved:
        return f"not a usable {what} name: {text!r}" + (
            f" (it must not contain {''.join(bad)!r})" if bad else ""
        )
    return None


@dataclass(frozen=True)
class BrokerSettings:
    """Where a publisher sends, in plain values.

    ``destination`` is the exchange or topic of entries (None: the broker adapter's
    default); ``routing_key`` the routing key or topic of entries without a destination
    of their own (None: their type); ``declare`` the adapter's own setup at start, if any
    (an exchange type for RabbitMQ); ``timeout`` the seconds to reach the broker.
    """

    url: str = field(repr=False)
    destination: str | None = None
    routing_key: str | None = None
    wire: WireFormat = WireFormat.PLAIN
    timeout: float = 5.0
    declare: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class BrokerAdapter(Protocol):
    """A broker adapter, as the ``docoutbox.brokers`` entry point group names it.

    ``publisher`` returns a publisher that has reached the broker (or raises
    :class:`~docoutbox.errors.BrokerUnavailable`); its ``close`` releases the connection.
    """

    label: str
    extra: str

    def publisher(self, settings: BrokerSettings) -> Publisher: ...
