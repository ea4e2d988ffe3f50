"""What the dispatcher's adapters must provide: publishers, dead letters, change sources,
checkpoints, lease tables, and the ownership of partitions. Adapters perform I/O; they
decide nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
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
    (``StoreConfig.partitions``). Tables whose partitions are something else implement
    :class:`LocatedLeases` as well; tables that keep stream positions with their leases,
    :class:`PositionedLeases`.
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


#: A set of partitions to sweep; None means every document, whatever its partition.
Scope = frozenset[int] | None


@runtime_checkable
class Ownership(Protocol):
    """Which partitions this dispatcher instance may touch, right now (see
    :mod:`docoutbox.dispatch.drivers.ownership`)."""

    def start(self) -> None: ...

    def stop(self, *, release: bool = True) -> None: ...

    def owned(self) -> Scope:
        """The partitions currently held (None: all of them)."""
        ...

    def enter(self, partition: int) -> bool:
        """Start work in ``partition``; False (and no work) if it is not held."""
        ...

    def leave(self, partition: int) -> None: ...

    def valid(self, partition: int) -> bool:
        """Whether work inside ``partition`` may still publish or trim."""
        ...

    def take_acquired(self) -> list[Scope]:
        """Scopes gained since the last call, to be swept without grace (see
        :class:`ResumingOwnership`)."""
        ...


@runtime_checkable
class LocatedOwnership(Protocol):
    """Optional: an :class:`Ownership` that says itself which partition a document
    belongs to (Cosmos DB feed ranges), rather than the partition stored on it.

    ``locator()`` is that mapping, or None when the stored partition is the one.
    """

    def locator(self) -> Callable[[Document], int] | None: ...


@runtime_checkable
class AnnouncingOwnership(Protocol):
    """Optional: an :class:`Ownership` that says when it gains partitions:
    ``on_acquired(callback)`` has ``callback()`` called (from any thread) whenever
    ``take_acquired`` has something new. An idle dispatcher then sleeps until its next
    timed work; with an ownership that does not say, it looks every ``poll_interval``."""

    def on_acquired(self, callback: Callable[[], None]) -> None: ...


@runtime_checkable
class ResumingOwnership(Protocol):
    """Optional: an :class:`Ownership` whose gained scopes may resume from positions
    stored with their leases: ``resumes(scope)`` is then True, the stream covers them and
    no sweep is needed (without it, every scope gained is swept)."""

    def resumes(self, scope: Scope) -> bool: ...


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


@runtime_checkable
class LanedSource(Protocol):
    """Optional: a :class:`ChangeSource` made of independent lanes (Cosmos DB feed ranges).

    Its events carry their ``lane``. ``merge_positions(latest, held)`` is ``latest`` with
    each lane in ``held`` at the position ``held`` gives for it: an unfinished event then
    holds back the checkpoint of its own lane only
    (:class:`~docoutbox.dispatch.engine.checkpoint.LanedTracker`). It is pure and sync, on
    an async source too.
    """

    def merge_positions(self, latest: Position, held: Mapping[Hashable, Position]) -> Position: ...


@runtime_checkable
class LocatedLeases(Protocol):
    """Optional: a :class:`LeaseTable` whose partitions are not the numbers stored on the
    documents (Cosmos DB feed ranges).

    ``partitions`` is how many the group has; ``locate(document)`` the one a document
    belongs to. The dispatcher then uses it for every event and sweep.
    """

    @property
    def partitions(self) -> int: ...

    def locate(self, document: Document) -> int: ...


@runtime_checkable
class PositionedLeases(Protocol):
    """Optional: a :class:`LeaseTable` that stores each partition's stream position with
    its lease (Cosmos DB feed ranges carrying their continuations).

    - ``resumes(partition)``, asked right after a successful ``acquire``: True when the
      partition resumes from such a stored position, so the new owner needs no sweep of it;
    - ``guard_checkpoints(check, usable)``: given the holder's ``check(partition)``, which
      the table asks before storing a partition's position (a holder that may have passed
      events over must not store it), and ``usable(partition)``, whether the holder works
      in it (yet).
    """

    def resumes(self, partition: int) -> bool: ...

    def guard_checkpoints(
        self, check: Callable[[int], bool], usable: Callable[[int], bool]
    ) -> None: ...


@runtime_checkable
class StreamLeases(Protocol):
    """Optional: a :class:`LeaseTable` with its own change stream per partition (Cosmos
    DB feed ranges): ``leased_ports()`` is the change source that reads only the held
    partitions, and the checkpoints that store their positions in the leases. Leased
    instances use those instead of the kit's own source and checkpoints."""

    def leased_ports(self) -> tuple[ChangeSource, Checkpoints]: ...


@runtime_checkable
class TracedPublisher(Protocol):
    """Optional: a publisher that names a publish's messaging attributes for its span
    (OpenTelemetry semantic conventions: the exchange or topic, the routing key)."""

    def trace_attributes(self, entry: OutboxMessage) -> Mapping[str, str]: ...


@runtime_checkable
class Closeable(Protocol):
    """Optional: a port that holds a connection to release (``close``)."""

    def close(self) -> None: ...


def check_publisher(publisher: object, *, asynchronous: bool = False) -> None:
    """:class:`~docoutbox.errors.InvalidConfig` unless ``publisher`` is a
    :class:`Publisher` (an :class:`AsyncPublisher` with a coroutine ``publish`` when
    ``asynchronous``)."""
    name = type(publisher).__name__
    if not isinstance(publisher, Publisher | AsyncPublisher) or not callable(publisher.publish):
        raise InvalidConfig(f"a publisher needs a publish method, got {name}")
    if asynchronous and not inspect.iscoroutinefunction(publisher.publish):
        raise InvalidConfig(
            "an async publisher needs an async publish method (in_thread() makes one of a "
            f"sync publisher), got {name}"
        )
