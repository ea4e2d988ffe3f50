"""What the dispatcher's adapters must provide: publishers, dead letters, change sources,
checkpoints and lease tables. Adapters perform I/O; they decide nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from docoutbox.errors import InvalidConfig
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.store.document import Document


@runtime_checkable
class Publisher(Protocol):
    """Sends outbox entries to a broker, one at a time, in the order given.

    ``publish`` returns only once the broker has durably accepted the entry (publisher
    confirms). It raises :class:`~docoutbox.errors.PublishError` when the broker refuses
    or returns the message, :class:`~docoutbox.errors.PermanentPublishError` when it never
    will accept it, and :class:`~docoutbox.errors.BrokerUnavailable` when it cannot be
    reached. It never returns normally for a message that was not accepted.
    """

    def publish(self, entry: OutboxMessage) -> None: ...


@runtime_checkable
class AsyncPublisher(Protocol):
    """The async twin of :class:`Publisher`."""

    async def publish(self, entry: OutboxMessage) -> None: ...


@runtime_checkable
class PipelinedPublisher(Publisher, Protocol):
    """A :class:`Publisher` that keeps several entries in flight: an optional capability.

    ``publish_many`` sends every entry of ``entries`` without waiting for the previous
    one's confirmation, then waits for them all, and returns one outcome per entry, in
    order: None once the broker durably accepted it, or the error ``publish`` would have
    raised for it (:class:`~docoutbox.errors.PublishError`,
    :class:`~docoutbox.errors.PermanentPublishError`,
    :class:`~docoutbox.errors.BrokerUnavailable`). It never reports None for an entry that
    was not confirmed, and an error of one entry says nothing of the others.

    The entries of one call are independent: the dispatcher puts at most one entry of an
    aggregate in a call and sends the aggregate's next entry only once this one is
    confirmed, so per-aggregate order (I4) never depends on what a broker does with the
    messages after one it refused. The dispatcher checks for this capability once, when
    it is built; a publisher without it gets the entries one at a time.
    """

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]: ...


@runtime_checkable
class AsyncPipelinedPublisher(AsyncPublisher, Protocol):
    """The async twin of :class:`PipelinedPublisher`."""

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]: ...


@runtime_checkable
class DeadLetters(Protocol):
    """Where quarantined entries go, with their error. ``put`` is idempotent by entry ID."""

    def put(
        self, aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
    ) -> None: ...


#: Where a change stream stands: opaque to the core, stored as is by :class:`Checkpoints`.
Position = Any


@dataclass(frozen=True)
class ChangeEvent:
    """One change of an aggregate document, as a :class:`ChangeSource` delivers it.

    ``document`` is the document after the change (None when unknown, e.g. deleted);
    ``position`` is where to resume so that the next event is the one after this.
    ``current`` says the document was read when the event was delivered (MongoDB's
    ``updateLookup`` of an update), not as of the change (an insert's document, or a log
    of copies): a current copy may be published from without reloading it. Leave it
    False when unsure; the dispatcher then reloads.

    ``lane``: for a source made of independent streams (Cosmos DB feed ranges), the one
    this event came from. With a ``merge_positions`` method on the source, an unfinished
    event then holds back the checkpoint of its own lane only
    (:class:`~docoutbox.dispatch.engine.checkpoint.LanedTracker`).
    """

    position: Position
    document: Document | None
    current: bool = False
    lane: Hashable | None = None


@runtime_checkable
class ChangeSource(Protocol):
    """A resumable stream of document changes, polled without blocking.

    ``open`` and ``poll`` raise :class:`~docoutbox.errors.ChangeStreamLost` when the
    position cannot be resumed, and :class:`~docoutbox.errors.StoreError` otherwise.
    """

    def start_marker(self) -> Position:
        """A position no later than now: changes committed after this call follow it."""
        ...

    def open(self, position: Position) -> None:
        """(Re)start the stream right after ``position``, closing any open one."""
        ...

    def poll(self, max_events: int) -> list[ChangeEvent]:
        """The next changes, at most ``max_events``; an empty list when there are none yet."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Checkpoints(Protocol):
    """Durable stream positions by dispatcher name."""

    def load(self, name: str) -> Position | None: ...

    def save(self, name: str, position: Position) -> None: ...


@dataclass(frozen=True)
class LeaseView:
    """Every lease and live member of one lease group, as read at one moment.

    ``leases`` maps a partition to ``(owner, expires_at)``; ``members`` maps an owner to
    the expiry of its membership heartbeat. Expiries are timezone-aware UTC datetimes.
    """

    leases: Mapping[int, tuple[str, datetime]]
    members: Mapping[str, datetime]


@runtime_checkable
class LeaseTable(Protocol):
    """Partition leases of one group (the aggregates of one collection).

    Every write is conditional; a lost race is reported as False, never as an error.

    Partitions are, by default, the numbers stored on the documents
    (``StoreConfig.partitions``). A table whose partitions are something else (Cosmos DB
    feed ranges) also defines ``locate(document) -> int``, the partition a document
    belongs to; the dispatcher then uses it for every event and sweep.

    A table that stores each partition's stream position with its lease (Cosmos DB feed
    ranges) may also define ``resumes(partition) -> bool``, asked right after a
    successful ``acquire``: True when the partition resumes from such a stored position,
    so the new owner needs no sweep of it; and ``guard_checkpoints(check, usable)``, given
    the holder's ``check(partition) -> bool``, which the table asks before storing a
    partition's position (a holder that may have passed events over must not store it),
    and ``usable(partition) -> bool``, whether the holder works in it (yet).
    """

    def read(self) -> LeaseView: ...

    def join(self, owner: str, expires_at: datetime) -> None:
        """Record (or refresh) ``owner`` as a live member until ``expires_at``."""
        ...

    def leave(self, owner: str) -> None: ...

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        """Take ``partition`` if it is free, expired at ``now``, or already ``owner``'s."""
        ...

    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        """Extend those of ``partitions`` that ``owner`` still holds."""
        ...

    def release(self, partition: int, owner: str) -> None:
        """Give ``partition`` up if ``owner`` holds it."""
        ...


@runtime_checkable
class AsyncDeadLetters(Protocol):
    """The async twin of :class:`DeadLetters`."""

    async def put(
        self, aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
    ) -> None: ...


@runtime_checkable
class AsyncChangeSource(Protocol):
    """The async twin of :class:`ChangeSource`."""

    async def start_marker(self) -> Position: ...

    async def open(self, position: Position) -> None: ...

    async def poll(self, max_events: int) -> list[ChangeEvent]: ...

    async def close(self) -> None: ...


@runtime_checkable
class AsyncCheckpoints(Protocol):
    """The async twin of :class:`Checkpoints`."""

    async def load(self, name: str) -> Position | None: ...

    async def save(self, name: str, position: Position) -> None: ...


def check_publisher(publisher: object, *, asynchronous: bool = False) -> None:
    """:class:`~docoutbox.errors.InvalidConfig` unless ``publisher`` has a ``publish``
    method, a coroutine function when ``asynchronous``."""
    publish, name = getattr(publisher, "publish", None), type(publisher).__name__
    if not callable(publish):
        raise InvalidConfig(f"a publisher needs a publish method, got {name}")
    if asynchronous and not inspect.iscoroutinefunction(publish):
        raise InvalidConfig(
            "an async publisher needs an async publish method (in_thread() makes one of a "
            f"sync publisher), got {name}"
        )
