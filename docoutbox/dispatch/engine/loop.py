"""The dispatch loop, sans-IO: one engine for the threaded, asyncio and simulated drivers.

:class:`DispatchEngine` decides; a driver performs. It has two kinds of flows, both
generators that yield operations (:data:`EngineOp`) and receive their results, driven by
:func:`docoutbox.drive.drive` or :func:`~docoutbox.drive.drive_async`:

- :meth:`DispatchEngine.turn`, one turn of the control loop: queue sweeps (periodic, on
  every partition acquired, in full when the stream position is lost), fetch one sweep
  page (taking turns with stream reads, so a long sweep never keeps the stream unread
  and the checkpoint still), poll the change stream (opening it from the checkpoint, or
  fresh behind a :class:`~docoutbox.dispatch.engine.checkpoint.Gate`; paced: not while a round
  of runs waits for workers, and once drained only every ``poll_interval``, a wait that
  doubles while reads keep bringing nothing, up to ``max_stream_wait``, where it starts
  once the stream opens, and starts over on a pending document or
  :meth:`DispatchEngine.read_soon`), and save the checkpoint behind the completed
  prefix of events (I5);
- :meth:`DispatchEngine.run`, one aggregate's run: take the copy of the document that
  came with its latest request (an event's or a sweep's; entries never change, and those
  this instance trimmed since are left out) or load it, then publish its pending
  entries in ``seq`` order with :func:`~docoutbox.dispatch.engine.flow.dispatch_document` (I4),
  trimming what was published, as long as its partition is held.
- :meth:`DispatchEngine.run_batch`, the runs a worker is handed, in lockstep: their
  publishes go out in rounds (:class:`PublishRound`, one entry per aggregate, confirms
  in flight together), their trims in one :class:`TrimRound`.

Which runs may begin is the :class:`~docoutbox.dispatch.engine.scheduler.AggregateQueue`'s call
(:meth:`DispatchEngine.start_runs`); the driver runs them, concurrently or not, and
reports each back with :meth:`DispatchEngine.finish`. Time (``monotonic`` and ``clock``)
and randomness (``rng``) are injected, so a driver may be a deterministic simulation.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from docoutbox.dispatch.engine.backlog import stream_lag
from docoutbox.dispatch.engine.batching import deal
from docoutbox.dispatch.engine.checkpoint import (
    Done,
    Gate,
    LanedTracker,
    Merge,
    PositionTracker,
    Sweep,
    always_done,
)
from docoutbox.dispatch.engine.deferred import DeferredTrims
from docoutbox.dispatch.engine.due import settle_plan
from docoutbox.dispatch.engine.due_clock import DueClock
from docoutbox.dispatch.engine.flow import (
    DispatchPolicy,
    DispatchResult,
    Publish,
    Quarantine,
    dispatch_document,
)
from docoutbox.dispatch.engine.metrics import Metrics, NullMetrics, StreamLagMetrics
from docoutbox.dispatch.engine.scheduler import AggregateQueue, RunOutcome, RunSlot, Ticket
from docoutbox.dispatch.engine.trimmed import TrimmedIds
from docoutbox.errors import (
    BrokerUnavailable,
    ChangeStreamLost,
    InvalidConfig,
    PartitionMismatch,
    PayloadMissing,
    StoreError,
)
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.ports.dispatch import (
    ChangeEvent,
    LocatedOwnership,
    Ownership,
    Position,
    ResumingOwnership,
)
from docoutbox.retry import MAX_COUNT, Backoff, check_int, check_seconds
from docoutbox.store.core import MAX_BATCH, MAX_PARTITIONS, FindPending, Load, Sleep, Write
from docoutbox.store.document import ID, Document, partition_of
from docoutbox.store.plans import TrimPlan
from docoutbox.stored.claim import DeletePayloads, GetPayload
from docoutbox.stored.codec import Codec
from docoutbox.stored.sweep import DeadLettered
from docoutbox.stored.upcast import Upcasters
from docoutbox.stored.values import StoredValues

log = logging.getLogger("docoutbox.dispatcher")


#: Counts sent to the database as page sizes (``sweep_page``, ``batch_size``: MongoDB's
#: ``limit``, Cosmos DB's ``TOP`` and ``max_item_count``) share the store's page bound.
PAGE_COUNTS = frozenset({"sweep_page", "batch_size"})


@dataclass(frozen=True)
class DispatcherConfig:
    name: str = "docoutbox"
    #: Must equal the stores' ``StoreConfig.partitions``.
    partitions: int = 16
    #: Workers (threads or tasks) publishing at once.
    concurrency: int = 32
    #: Aggregates one worker runs together: it publishes each one's entries, then trims
    #: them all in one round (:class:`TrimRound`), so the trims of many aggregates go out
    #: in one round trip and a worker is handed many runs at once. With publish rounds,
    #: the runs begun are packed at up to this many per worker, so a round carries up to
    #: this many entries; without, they are spread over every free worker
    #: (:mod:`~docoutbox.dispatch.engine.batching`).
    run_batch: int = 16
    policy: DispatchPolicy = field(default_factory=DispatchPolicy)
    sweep_interval: float = 60.0
    grace: float = 30.0
    poll_interval: float = 0.05
    #: The longest wait between two reads of the change stream while reads bring no
    #: pending document: after each such read the wait doubles, from ``poll_interval`` up
    #: to this; a read that brings one, or :meth:`DispatchEngine.read_soon`, starts it
    #: over. A stream just opened waits this long after each read until then: nothing
    #: says entries are coming. None: every ``poll_interval``. Waits count from a read's
    #: start, so a server that holds an empty read itself (MongoDB's ``maxAwaitTimeMS``,
    #: 1 s by default) is read again at once; one that answers at once (the wire server,
    #: whose every read scans its whole oplog; Cosmos DB, which bills every read) is read
    #: less often.
    max_stream_wait: float | None = None
    batch_size: int = 500
    sweep_page: int = 100
    max_outstanding: int = 10_000
    max_backlog: int = 1_000
    checkpoint_interval: float = 1.0
    backoff: Backoff = field(default_factory=Backoff)
    #: Decodes the stored entries (the stores' codec, or one holding every key they may
    #: have written under); None: entries are plain (:mod:`docoutbox.stored`).
    codec: Codec | None = None
    #: Upcasts the payloads of old stored entries before they are published.
    upcasters: Upcasters | None = None
    #: Seconds between two queries for documents whose scheduled entries fell due (on
    #: stores that can answer it): a due entry waits at most about this long for its
    #: run, unless a timer set from a change event or a run starts it sooner.
    due_interval: float = 0.5
    #: Trims off the publish path (:mod:`~docoutbox.dispatch.engine.deferred`): a run's
    #: trims are coalesced per aggregate and written behind its publishes, at the latest
    #: this many seconds after the oldest is handed over (plus one round trip). 0: each
    #: run writes its own trims before it ends. Longer delays save trim requests on busy
    #: aggregates (Cosmos DB); after a crash, more entries are published again.
    trim_delay: float = 0.002
    #: Published entries whose deferred trim is pending, at most: beyond it, a run writes
    #: its trim itself. A flush starts once half of it is pending.
    max_untrimmed: int = 2_000
    #: Claim-checked entries (:mod:`docoutbox.stored.claim`) go out with their reference
    #: envelope as payload, for consumers that fetch payloads themselves; their payloads
    #: are then left to the orphan sweep. False (the default): payloads are resolved.
    publish_references: bool = False

    def __post_init__(self) -> None:
        for name in (
            "concurrency",
            "run_batch",
            "batch_size",
            "sweep_page",
            "max_outstanding",
            "max_backlog",
            "max_untrimmed",
        ):
            high = MAX_BATCH if name in PAGE_COUNTS else MAX_COUNT
            check_int(f"DispatcherConfig.{name}", getattr(self, name), 1, high)
        check_int("DispatcherConfig.partitions", self.partitions, 1, MAX_PARTITIONS)
        for name in ("sweep_interval", "poll_interval", "due_interval"):
            check_seconds(f"DispatcherConfig.{name}", getattr(self, name), positive=True)
        for name in ("grace", "checkpoint_interval", "trim_delay"):
            check_seconds(f"DispatcherConfig.{name}", getattr(self, name))
        if self.max_stream_wait is not None:
            check_seconds("DispatcherConfig.max_stream_wait", self.max_stream_wait)
            if self.max_stream_wait < self.poll_interval:
                raise InvalidConfig(
                    f"DispatcherConfig.max_stream_wait ({self.max_stream_wait}) must be at "
                    f"least poll_interval ({self.poll_interval})"
                )
        StoredValues(self.codec, self.upcasters)  # refuses a codec or upcasters of a wrong type
        if type(self.publish_references) is not bool:
            raise InvalidConfig(
                f"DispatcherConfig.publish_references must be a bool, "
                f"got {self.publish_references!r}"
            )

    @classmethod
    def polling(cls, interval: float = 1.0, **options: Any) -> DispatcherConfig:
        """Polling mode, for deployments without change streams: sweep every ``interval``
        seconds with no grace period, so a new entry is published within about
        ``interval``. A dispatcher without a change source uses it by default."""
        return cls(sweep_interval=interval, grace=0.0, **options)


# -- the operations a driver performs, besides the store's and the publish flow's --------


@dataclass(frozen=True)
class StartMarker:
    """:meth:`ChangeSource.start_marker`."""


@dataclass(frozen=True)
class OpenStream:
    """:meth:`ChangeSource.open`."""

    position: Position


@dataclass(frozen=True)
class PollChanges:
    """:meth:`ChangeSource.poll`: a list of :class:`~docoutbox.ports.dispatch.ChangeEvent`."""

    max_events: int


@dataclass(frozen=True)
class CloseStream:
    """:meth:`ChangeSource.close`."""


@dataclass(frozen=True)
class LoadCheckpoint:
    """:meth:`Checkpoints.load`."""

    name: str


@dataclass(frozen=True)
class SaveCheckpoint:
    """:meth:`Checkpoints.save`."""

    name: str
    position: Position


@dataclass(frozen=True)
class TrimRound:
    """Write these trims together (one round trip where the backend can). The reply has
    one outcome per plan, in order: its result, or the exception that failed it."""

    plans: tuple[TrimPlan, ...]


@dataclass(frozen=True)
class PublishRound:
    """Publish these entries, each of a different aggregate, with their confirmations in
    flight together (:class:`~docoutbox.ports.dispatch.PipelinedPublisher`; one at a time
    with a publisher that cannot). The reply has one outcome per entry, in order: None
    once the broker confirmed it, or the exception that failed it."""

    entries: tuple[OutboxMessage, ...]


@dataclass(frozen=True)
class FindDue:
    """:meth:`~docoutbox.ports.store.DueBackend.find_due`: documents whose due-time hint
    is at or before ``due_before``, in ``_id`` order after ``after``."""

    due_before: datetime
    after: AggregateId | None
    limit: int
    partitions: Collection[int] | None


StreamOp = StartMarker | OpenStream | PollChanges | CloseStream | LoadCheckpoint | SaveCheckpoint
RunOp = Load | Publish | Quarantine | Write | Sleep | GetPayload | DeadLettered | DeletePayloads
BatchOp = RunOp | PublishRound | TrimRound
EngineOp = StreamOp | BatchOp | FindPending | FindDue


class BrokerState:
    """Logs the broker going down and coming back once each, not once per attempt."""

    def __init__(self) -> None:
        self._down = False
        self._lock = threading.Lock()

    def down(self, exc: BaseException) -> None:
        with self._lock:
            changed, self._down = not self._down, True
        if changed:
            log.warning("broker_unavailable error=%s; entries stay pending", exc)

    def up(self) -> None:
        if not self._down:
            return
        with self._lock:
            changed, self._down = self._down, False
        if changed:
            log.warning("broker_available_again")


#: Reads that brought nothing, as counted when the stream (re)opens: its waits start at
#: ``max_stream_wait`` (see :meth:`DispatchEngine._quiet_wait`).
QUIET_ON_OPEN = 64

#: Documents :meth:`DispatchEngine.check_partitions` samples at start-up.
PARTITION_SAMPLE = 50


def event_target(doc: Document | None, partitions: int) -> tuple[AggregateId, int] | None:
    """The aggregate and partition of a document with pending entries, else None.

    A stored partition outside ``range(partitions)`` (a store configured with more
    partitions than the dispatcher) is logged and mapped into range, so the event is not
    lost; sweeps cannot find such a document (see :func:`partition_mismatch`).
    """
    if not doc or not doc.get("outbox"):
        return None
    aggregate_id = doc.get(ID)
    if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
        return None
    partition = doc.get("partition")
    if isinstance(partition, bool) or not isinstance(partition, int):
        partition = partition_of(aggregate_id, partitions)
    elif not 0 <= partition < partitions:
        log.error(
            "partition_out_of_range aggregate=%r partition=%d partitions=%d",
            aggregate_id,
            partition,
            partitions,
        )
    return aggregate_id, partition % partitions


def partition_mismatch(docs: list[Document], partitions: int) -> str | None:
    """Why ``docs`` show the stores partition differently from ``partitions``, or None.

    A document's stored ``partition`` must be ``partition_of(_id, partitions)``: anything
    else means the stores and the dispatcher disagree on the partition count.
    """
    for doc in docs:
        aggregate_id, stored = doc.get(ID), doc.get("partition")
        if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
            continue
        if isinstance(stored, bool) or not isinstance(stored, int):
            continue
        expected = partition_of(aggregate_id, partitions)
        if stored != expected:
            return (
                f"document {aggregate_id!r} is stored in partition {stored}, but with "
                f"{partitions} partitions it belongs to {expected}: the stores' "
                "StoreConfig.partitions differs from the dispatcher's"
            )
    return None


class _Completion:
    """Whether the work behind a request is complete: a run that began after it
    succeeded, and what that run published (or found published) is trimmed (I5).

    One object per event the checkpoint waits for (a bound method in a ``partial`` was
    three, each one more for the garbage collector while the event is in flight).
    """

    __slots__ = ("engine", "ticket")

    def __init__(self, engine: DispatchEngine, ticket: Ticket) -> None:
        self.engine = engine
        self.ticket = ticket

    def __call__(self) -> bool:
        ticket, engine = self.ticket, self.engine
        if not engine.queue.done(ticket):
            return False
        deferred = engine.deferred
        return deferred is None or deferred.settled(ticket.aggregate_id, ticket.generation)


class _Lockstep:
    """One run of :meth:`DispatchEngine.run_batch`: its flow, and what to send it next."""

    __slots__ = ("error", "finished", "flow", "outcome", "slot", "trim", "value")

    def __init__(self, slot: RunSlot, flow: Generator[RunOp, Any, RunOutcome]) -> None:
        self.slot = slot
        self.flow = flow
        self.outcome: RunOutcome | None = None
        #: Whether the engine has finished this run (:meth:`DispatchEngine.finish`).
        self.finished = False
        self.value: Any = None
        self.error: Exception | None = None
        #: The trim this run waits at, until the batch's next trim round.
        self.trim: TrimPlan | None = None

    def reply(self, value: Any) -> None:
        self.value, self.error = value, None

    def fail(self, error: Exception) -> None:
        self.value, self.error = None, error

    def over(self) -> RunOutcome:
        assert self.outcome is not None, "the run is not over"
        return self.outcome

    def step(self) -> RunOp | None:
        """Resume the run: its next operation, or None once it is over."""
        if self.outcome is not None:
            return None
        value, error = self.value, self.error
        self.value, self.error = None, None
        try:
            return self.flow.send(value) if error is None else self.flow.throw(error)
        except StopIteration as stop:
            self.outcome = stop.value
        except Exception as exc:  # logged; the aggregate is retried, not dropped
            log.exception("dispatch_run_failed aggregate=%r error=%r", self.slot.aggregate_id, exc)
            self.outcome = RunOutcome.RETRY
        return None


class DispatchEngine:
    """The dispatcher's state and decisions; see the module docstring."""

    def __init__(
        self,
        config: DispatcherConfig,
        ownership: Ownership,
        *,
        stream: bool,
        checkpoints: bool,
        monotonic: Callable[[], float],
        clock: Callable[[], datetime],
        rng: random.Random,
        metrics: Metrics | None = None,
        merge_positions: Merge | None = None,
    ) -> None:
        self.config = config
        self.ownership = ownership
        #: Whether a batch's publishes go out in rounds (:class:`PublishRound`): for a
        #: publisher with confirmations in flight together. Without one, each publish is
        #: confirmed before it returns, so a run publishes its entries in turn, as fast.
        self.rounds = True
        self.stream = stream
        self.checkpoints = checkpoints
        #: Which ownership partition a document belongs to, when the ownership says so
        #: itself (Cosmos DB feed ranges) rather than by the documents' stored partition.
        self._locate = ownership.locator() if isinstance(ownership, LocatedOwnership) else None
        #: Whether a scope gained resumes from positions stored with its leases.
        self._resumes = ownership.resumes if isinstance(ownership, ResumingOwnership) else None
        self.metrics = metrics or NullMetrics()
        self._lag_report = (
            self.metrics.stream_lag if isinstance(self.metrics, StreamLagMetrics) else None
        )
        #: Whether publishes report their lag: not to NullMetrics itself (a subclass may).
        self._timed = type(self.metrics) is not NullMetrics
        self.broker = BrokerState()
        self._mono = monotonic
        self._clock = clock
        self._rng = rng
        #: Decodes and upcasts stored entries before they are published (None: plain).
        self._values = StoredValues.of(config.codec, config.upcasters)
        #: Runs that all workers take at once: ready beyond it, a run waits for a worker.
        self._full_round = config.concurrency * config.run_batch
        self.queue = AggregateQueue(workers=self._full_round, backoff=config.backoff, rng=rng)
        #: Entries this instance trimmed lately: skipped in documents that came with
        #: requests (an event's copy may predate a trim). Bounded by what is in flight.
        self.trimmed = TrimmedIds.for_config(config)
        #: Trims written behind the publishes (None: each run writes its own).
        self.deferred = (
            DeferredTrims(delay=config.trim_delay, limit=config.max_untrimmed)
            if config.trim_delay > 0
            else None
        )
        self.sweeps: deque[Sweep] = deque()
        #: How the stream's source combines the positions of its lanes (None: one lane).
        self._merge = merge_positions
        self.tracker = self._tracker()
        #: The checkpoint last saved (or loaded).
        self.saved: Position | None = None
        self._loaded = not checkpoints
        self._resume: Position | None = None
        self._open = False
        self._failures = 0
        self._retry_at = 0.0
        self._next_save = 0.0
        self._next_sweep = 0.0
        #: No poll before this (set after a poll that brought no change).
        self._next_poll = 0.0
        #: Reads in a row that brought no pending document (they space out the next).
        self._quiet_reads = 0
        #: A sweep page was fetched since the stream's last read (see _page_waits).
        self._paged = False
        #: When to query for scheduled entries fallen due (see :meth:`due_scan`).
        self.due = DueClock(config.due_interval, monotonic, clock)
        #: Whether the store answers :class:`FindDue` (set by the driver from its ports).
        self.due_scans = False

    # -- the control loop -------------------------------------------------------------

    def check_partitions(self) -> Generator[EngineOp, Any, None]:
        """Refuse to start (:class:`PartitionMismatch`) if the stores partition differently.

        Samples documents with pending entries (if there are none, there is nothing to
        strand yet). Nothing to check when the ownership locates documents itself.
        """
        if self._locate is not None:
            return
        try:
            docs: list[Document] = yield FindPending(None, PARTITION_SAMPLE, None, None)
        except StoreError as exc:
            log.warning("partition_check_skipped error=%r", exc)
            return
        why = partition_mismatch(docs, self.config.partitions)
        if why is not None:
            log.error("partition_mismatch %s", why)
            raise PartitionMismatch(why)

    def begin(self) -> None:
        """Call once, after the ownership started and before the first :meth:`turn`."""
        self._next_sweep = self._mono() + self.config.sweep_interval
        if not self.stream:
            self._add_sweep(Sweep(self.ownership.owned(), None))

    def turn(self) -> Generator[EngineOp, Any, bool]:
        """One turn of the loop; returns whether anything happened."""
        now = self._mono()
        for scope in self.ownership.take_acquired():
            self.due.soon()
            self.queue.drop_copies(scope)
            if self._resumes is None or not self._resumes(scope):
                self._add_sweep(Sweep(scope, None))
        if now >= self._next_sweep:
            self._next_sweep = now + self.config.sweep_interval
            self._queue_periodic_sweep()
        # A stream is opened before any sweep page: a fresh start's sweep then covers the
        # sweeps of the partitions acquired meanwhile, which are not run twice.
        opening = self.stream and not self._open
        busy = (yield from self._stream_step(now)) if opening else False
        busy = (yield from self._sweep_step()) or busy
        busy = (yield from self.due_scan(now)) or busy
        if self.stream:
            if not opening:
                busy = (yield from self._stream_step(now)) or busy
            yield from self.checkpoint(now)
        # The outbox backlog is measured in the database (dispatch.backlog.BacklogMonitor);
        # self.queue holds only what this instance has in hand (queued()).
        return busy

    @property
    def stream_open(self) -> bool | None:
        """Whether the change stream is open (None without a change stream)."""
        return self._open if self.stream else None

    def _queue_periodic_sweep(self) -> None:
        scope = self.ownership.owned()
        if scope is not None and not scope:
            return
        if any(s.gate is None and s.older_than is not None for s in self.sweeps):
            return
        older_than = self._clock() - timedelta(seconds=self.config.grace)
        self._add_sweep(Sweep(scope, older_than))

    def _add_sweep(self, sweep: Sweep) -> None:
        """Queue ``sweep``, unless a queued one covers it; drop the queued ones it covers.

        A sweep without grace covers another within its scope: from its first page, if it
        has not fetched one yet, or wholly once queued, since it starts from the first
        document. A gated sweep is never dropped (its gate would never open). At start an
        instance acquires its first share as well as sweeping what it owns: without this,
        the same documents were swept twice, the second time after the first was logged as
        done.
        """
        for queued in self.sweeps:
            if sweep.gate is None and not queued.pages and queued.covers(sweep.scope):
                return
        kept = [q for q in self.sweeps if q.gate is not None or not sweep.covers(q.scope)]
        if len(kept) < len(self.sweeps):
            self.sweeps = deque(kept)
        self.sweeps.append(sweep)

    def _sweep_step(self) -> Generator[EngineOp, Any, bool]:
        if not self.sweeps or self.queue.backlog() >= self.config.max_backlog:
            return False
        if self.queue.ready() >= self._full_round or self._page_waits():
            return False
        sweep = self.sweeps[0]
        # A located ownership's partitions are not stored on the documents: page through
        # every pending document and keep those of the scope.
        scoped = sweep.scope is not None and self._locate is None
        partitions = sorted(sweep.scope) if scoped and sweep.scope is not None else None
        try:
            docs: list[Document] = yield FindPending(
                sweep.after, self.config.sweep_page, sweep.older_than, partitions
            )
        except StoreError as exc:
            log.warning("sweep_failed error=%r", exc)
            return False
        # Documents outside the scope came only because the query could not exclude them.
        scope = sweep.scope if self._locate is not None else None
        for doc in docs:
            done = self.request(doc, scope=scope)
            if done is not None:
                sweep.requested += 1
                if sweep.gate is not None:
                    sweep.gate.add(done)
        sweep.pages += 1
        self._paged = True
        if docs:
            sweep.after = docs[-1][ID]
        if len(docs) < self.config.sweep_page:
            self.sweeps.popleft()
            if sweep.gate is not None:
                sweep.gate.finished = True
            log.info(
                "sweep_done scope=%s grace=%s aggregates=%d",
                "all" if sweep.scope is None else sorted(sweep.scope),
                sweep.older_than is not None,
                sweep.requested,
            )
        return True

    def _page_waits(self) -> bool:
        """Whether the next sweep page waits for a read of the stream first.

        Pages and reads share the aggregates in hand, and a sweep refills them up to
        ``max_backlog`` while the stream reads only below one batch: left alone, a sweep
        kept the stream unread for as long as it found documents (under continuous
        traffic, new ones keep appearing ahead of its cursor), so no checkpoint was saved
        and entries behind its cursor waited. Once a page was fetched, the next waits for a
        read, unless the stream cannot read: closed, paced after a read that brought
        nothing, or holding ``max_outstanding`` positions (a gate's sweep must go on).
        """
        return (
            self._paged
            and self.stream
            and self._open
            and self._mono() >= self._next_poll
            and len(self.tracker) < self.config.max_outstanding
        )

    def request(
        self, doc: Document | None, *, reuse: bool = True, scope: frozenset[int] | None = None
    ) -> Done | None:
        """Ask for a run of the document's aggregate if it has pending entries and is ours
        (and in ``scope``, when given).

        With ``reuse`` the run publishes from ``doc`` (read recently: a sweep page, an
        event's lookup) instead of reloading it.
        """
        target = event_target(doc, self.config.partitions)
        if target is None:
            return None
        aggregate_id, partition = target
        if self._locate is not None:
            assert doc is not None
            partition = self._locate(doc)
        if scope is not None and partition not in scope:
            return None
        if not self.ownership.valid(partition):
            return None
        ticket = self.queue.request(aggregate_id, partition, doc if reuse else None)
        return _Completion(self, ticket)

    # -- the change stream ------------------------------------------------------------

    def _stream_step(self, now: float) -> Generator[EngineOp, Any, bool]:
        """Open the stream if needed, or poll one batch. True if anything happened."""
        if not self._open:
            if now < self._retry_at:
                return False
            yield from self._start_stream(now)
            return self._open
        room = self._poll_room(now)
        if room <= 0:
            return False
        try:
            events: list[ChangeEvent] = yield PollChanges(room)
        except ChangeStreamLost as exc:
            if exc.partitions is not None:
                # Only those partitions' positions: the source restarted them from now.
                # Their sweep needs no gate: whoever acquires them next sweeps them too.
                log.warning(
                    "stream_partly_lost partitions=%s error=%r; sweeping them",
                    sorted(exc.partitions),
                    exc,
                )
                self._add_sweep(Sweep(exc.partitions, None))
                return True
            log.warning("stream_lost error=%r; sweeping and restarting the stream", exc)
            self._resume, self._open = None, False
            return True
        except StoreError as exc:
            self._stream_failed(exc, now)
            return False
        self._paged = False
        report = self._lag_report
        for event in events:
            if report is not None and event.document is not None:
                lag = stream_lag(event.document, self._clock())
                if lag is not None:
                    report(lag)
            done = self.request(event.document, reuse=event.current)
            self.due.note(event.document)
            self.tracker.add_event(event.position, done or always_done, event.lane)
        self._resume = self.tracker.latest
        if any(event.document is not None for event in events):
            self._quiet_reads = 0
        else:
            # The stream is drained: read again after a wait, not on every wake.
            self._quiet_reads += 1
            self._next_poll = now + self._quiet_wait()
        return bool(events)

    def _quiet_wait(self) -> float:
        """The wait after the latest of ``_quiet_reads`` reads in a row that brought no
        pending document: ``poll_interval``, doubled for each further one, up to
        ``max_stream_wait``."""
        base, top = self.config.poll_interval, self.config.max_stream_wait
        if top is None:
            return base
        return min(top, base * 2.0 ** min(self._quiet_reads - 1, QUIET_ON_OPEN))

    def read_soon(self) -> None:
        """Read the stream at the next turn, and start its waits over: entries were
        just committed (say, by the consumers of the process this dispatcher runs in)."""
        self._next_poll = 0.0
        self._quiet_reads = 0

    def _settle_idle(self, doc: Document) -> Generator[EngineOp, Any, None]:
        """Remove the due-time hint of a document left with no pending entry (a run that
        trimmed its last scheduled entry died before its settle): no run would ever start
        for it, and every due query would find it again."""
        plan = settle_plan(doc, [])
        if plan is None:
            return
        try:
            yield Write(plan)
        except StoreError as exc:
            log.warning("settle_failed aggregate=%r error=%r", doc.get(ID), exc)

    def _poll_room(self, now: float) -> int:
        """How many events to read from the stream now (0: not now).

        Events bring documents: at most one batch of aggregates is in hand, never over
        ``max_backlog``, so memory stays flat however long the backlog. Nothing while this
        instance holds ``max_outstanding`` positions, nor while a full round of runs
        (``concurrency`` x ``run_batch``) waits for a free worker: reading ahead then adds
        nothing but load on the database, whose capacity the runs' trims need. Nor within
        ``poll_interval`` of a read that brought no change.
        """
        if len(self.tracker) >= self.config.max_outstanding:
            return 0
        if self.queue.ready() >= self._full_round or now < self._next_poll:
            return 0
        return min(self.config.batch_size, self.config.max_backlog) - self.queue.backlog()

    def _tracker(self, position: Position | None = None) -> PositionTracker:
        if self._merge is None:
            return PositionTracker(position)
        return LanedTracker(self._merge, position)

    def _start_stream(self, now: float) -> Generator[EngineOp, Any, None]:
        try:
            if not self._loaded:
                self._resume = self.saved = yield LoadCheckpoint(self.config.name)
                self.tracker = self._tracker(self._resume)
                self._loaded = True
            if self._resume is None:
                yield from self._fresh_start()
            else:
                try:
                    yield OpenStream(self._resume)
                except ChangeStreamLost as exc:
                    log.warning("stream_position_unusable error=%r; sweeping", exc)
                    yield from self._fresh_start()
        except StoreError as exc:
            self._stream_failed(exc, now)
            return
        self._open, self._failures = True, 0
        # Nothing seen yet says entries are coming: reads wait the longest until one
        # brings a pending document or read_soon is called.
        self._quiet_reads = QUIET_ON_OPEN
        log.info("stream_opened")

    def _fresh_start(self) -> Generator[EngineOp, Any, None]:
        """Open the stream at "now", and sweep everything owned with no grace period."""
        marker = yield StartMarker()
        yield OpenStream(marker)
        gate = Gate()
        self.tracker.reset(marker, gate)
        self._resume = marker
        self._add_sweep(Sweep(self.ownership.owned(), None, gate))

    def _stream_failed(self, exc: StoreError, now: float) -> None:
        self._open = False
        self._failures += 1
        delay = self.config.backoff.delay(self._failures, self._rng)
        self._retry_at = now + delay
        log.warning("stream_unavailable error=%r retry_in_s=%.2f", exc, delay)

    def checkpoint(self, now: float, *, force: bool = False) -> Generator[EngineOp, Any, None]:
        """Save the position behind the completed prefix (at most every interval)."""
        self.tracker.advance()
        safe = self.tracker.safe
        if not self.checkpoints or safe is None or safe == self.saved:
            return
        if now < self._next_save and not force:
            return
        try:
            yield SaveCheckpoint(self.config.name, safe)
        except StoreError as exc:
            log.warning("checkpoint_save_failed error=%r", exc)
            return
        self.saved = safe
        self._next_save = now + self.config.checkpoint_interval

    def shutdown(self, *, crashed: bool) -> Generator[EngineOp, Any, None]:
        """After the last run finished: a final checkpoint (unless crashed), close the stream."""
        if not self.stream:
            return
        if not crashed:
            yield from self.checkpoint(self._mono(), force=True)
        try:
            yield CloseStream()
        except StoreError as exc:
            log.warning("stream_close_failed error=%r", exc)

    # -- aggregate runs ---------------------------------------------------------------

    def start_runs(self, limit: int | None = None) -> list[RunSlot]:
        """The runs that may begin now; run each with :meth:`run`, then :meth:`finish` it."""
        return self.queue.start(self._mono(), limit)

    def start_batches(self, free: int) -> list[list[RunSlot]]:
        """The runs that may begin now, up to ``run_batch`` for each of ``free`` workers,
        dealt into batches (:func:`~docoutbox.dispatch.engine.batching.deal`: packed with
        publish rounds, spread without); run each batch with :meth:`run_batch` on a
        worker of its own, then :meth:`finish` each of its runs."""
        if free <= 0:
            return []
        run_batch = self.config.run_batch
        return deal(self.start_runs(free * run_batch), free, run_batch, rounds=self.rounds)

    def finish(self, slot: RunSlot, outcome: RunOutcome) -> None:
        """Record the end of ``slot``'s run. A run is finished once: :meth:`run_batch`
        finishes each of its runs as soon as it is over, and the driver's finish of the
        whole batch afterwards (with the batch's outcome if it failed) then leaves those
        alone. Only the worker running a slot finishes it, so the check cannot race."""
        if not self.queue.holds(slot):
            return
        if outcome is RunOutcome.DONE and self.deferred is not None:
            self.deferred.finished(slot.aggregate_id, slot.generation)
        self.queue.finish(slot, outcome, self._mono())

    def next_due(self) -> float | None:
        """Seconds until a delayed run may start or the stream may be read again, if either
        waits."""
        now = self._mono()
        due = self.queue.next_due(now)
        if self.stream and self._open and self._next_poll > now:
            poll = self._next_poll - now
            due = poll if due is None else min(due, poll)
        if self.due_scans:
            scan = self.due.wait(now)
            due = scan if due is None else min(due, scan)
        flush = self.deferred.next_due(now) if self.deferred is not None else None
        if flush is not None:
            due = flush if due is None else min(due, flush)
        return due

    def wake_in(self) -> float:
        """Seconds until time alone gives :meth:`turn` something to do: a delayed run, a
        read of the stream (:meth:`next_due`), a due query, a flush of deferred trims, its
        reopening after a failure, a checkpoint held back by ``checkpoint_interval``, or
        the periodic sweep. A driver whose turn did nothing may sleep this long, provided
        it is woken by everything else that gives a turn work: a run finishing, a flush
        ending, :meth:`read_soon`, scopes acquired, a stop."""
        now = self._mono()
        wait = self._next_sweep - now
        due = self.next_due()
        if due is not None:
            wait = min(wait, due)
        if self.stream and not self._open:
            wait = min(wait, self._retry_at - now)
        if self.checkpoints and self._next_save > now and self.tracker.safe != self.saved:
            # A save overdue failed (its turn logged it): it is tried again at the next
            # wake, not in a loop.
            wait = min(wait, self._next_save - now)
        return max(wait, 0.0)

    def due_scan(self, now: float) -> Generator[EngineOp, Any, bool]:
        """Query for documents whose scheduled entries fell due, when the due clock says,
        and ask for their runs (a page per turn while pages come back full).

        Rule (I5, I6 for scheduled entries): a change whose scheduled entries are not due
        yet is checkpointed past, and a sweep runs such a document without publishing
        them: this query, on the document's ``earliest_due`` hint, is what finds them
        once due, whatever happened to the stream position or the leases meanwhile.
        """
        if not self.due_scans or not self.due.ready(now):
            return False
        if self.queue.backlog() >= self.config.max_backlog:
            return False
        scope = self.ownership.owned()
        if scope is not None and not scope:
            self.due.scanned(now, None)
            return False
        partitions = sorted(scope) if scope is not None and self._locate is None else None
        try:
            docs: list[Document] = yield FindDue(
                self._clock(), self.due.after, self.config.sweep_page, partitions
            )
        except StoreError as exc:
            log.warning("due_scan_failed error=%r", exc)
            self.due.scanned(now, None)
            return False
        located = scope if self._locate is not None else None
        for doc in docs:
            if self.request(doc, scope=located) is None and not doc.get("outbox"):
                yield from self._settle_idle(doc)
        full = len(docs) >= self.config.sweep_page
        self.due.scanned(now, docs[-1][ID] if full else None)
        return bool(docs)

    def run(self, slot: RunSlot) -> Generator[RunOp, Any, RunOutcome]:
        """Publish and trim what the aggregate has pending now."""
        aggregate_id, partition = slot.aggregate_id, slot.partition
        if not self.ownership.enter(partition):
            return RunOutcome.DONE  # not ours: its owner sweeps it when acquiring
        try:
            doc = self._unpublished(slot.document)
            if doc is None:
                doc = self._unpublished((yield Load(aggregate_id)))
            if doc is None or not doc.get("outbox"):
                return RunOutcome.DONE
            result = yield from self._publish_flow(doc, partition, slot.generation)
        except StoreError as exc:
            log.warning("dispatch_store_error aggregate=%r error=%r", aggregate_id, exc)
            return RunOutcome.RETRY
        finally:
            self.ownership.leave(partition)
        if result is None:
            return RunOutcome.DONE
        self.due.expect(result.next_due)
        if result.count("orphaned"):
            log.warning(
                "payload_delete_failed aggregate=%r payloads=%d (left to the orphan sweep)",
                aggregate_id,
                result.count("orphaned"),
            )
        if result.count("missing"):
            log.error(
                "payload_missing aggregate=%r entries=%s (left pending, tried again)",
                aggregate_id,
                result.missing,
            )
            return RunOutcome.RETRY
        log.debug(
            "dispatched aggregate=%r published=%d quarantined=%d held=%d",
            aggregate_id,
            result.count("published"),
            result.count("quarantined"),
            result.count("held"),
        )
        return RunOutcome.UNAVAILABLE if result.unavailable else RunOutcome.DONE

    def run_batch(self, slots: Sequence[RunSlot]) -> Generator[BatchOp, Any, list[RunOutcome]]:
        """The runs of ``slots`` in lockstep, each slot's outcome in order.

        Each run goes as far as its next publish or trim; its loads, quarantines, failure
        records and sleeps are performed as they come, one run after another. The entries
        the runs wait to publish then go out together in one :class:`PublishRound`, with
        their confirmations in flight, and each run learns its own entry's outcome and
        goes on. Once every run waits at a trim (or is over), their trims go out in one
        :class:`TrimRound`, and so on until every run is over. A run that fails
        unexpectedly is retried later and does not stop the others. Without rounds
        (:attr:`rounds` False: a publisher that confirms each publish before it returns),
        a run's publishes are performed as they come, like its loads. Each run is
        finished (:meth:`finish`) as soon as it is over, not when the batch is: a short
        run packed with a long one does not hold its aggregate (and the checkpoint past
        it) until the long one ends.

        Rule (I4 with confirms in flight): a round holds at most one entry of an
        aggregate, and the aggregate's next entry goes out in a later round, once this
        one's outcome is known. A nack, a return or a failed record therefore concerns
        its own run only, which retries the entry (or quarantines it, or holds the rest
        while the broker is down) before any later entry of that aggregate is sent: first
        deliveries stay in ``seq`` order whatever the broker does with the messages that
        follow a refused one. Sending an aggregate's later entries ahead would not keep
        that: RabbitMQ may refuse one message (a full queue with ``reject-publish``) and
        accept the next, which consumers would then see first. A crash between publish
        and confirm, or between confirm and trim, leaves the entries pending: they are
        published again (at least once, I1).
        """
        runs = [_Lockstep(slot, self.run(slot)) for slot in slots]
        try:
            while True:
                # The runs waiting to publish, and their entries (a pair per run would be
                # one more object per run in flight).
                publishes: list[_Lockstep] = []
                entries: list[OutboxMessage] = []
                for run in runs:
                    while run.trim is None and (op := run.step()) is not None:
                        if isinstance(op, Publish) and self.rounds:
                            publishes.append(run)
                            entries.append(op.entry)
                            break
                        if isinstance(op, Write) and isinstance(op.plan, TrimPlan):
                            run.trim = op.plan
                            break
                        try:
                            run.reply((yield op))
                        except Exception as exc:  # noqa: BLE001 - thrown into the run
                            run.fail(exc)
                    if run.outcome is not None and not run.finished:
                        run.finished = True  # its aggregate may run again elsewhere now
                        self.finish(run.slot, run.outcome)
                if publishes:
                    yield from self._publish_round(publishes, entries)
                    continue
                trims = [run for run in runs if run.trim is not None]
                if not trims:
                    return [run.over() for run in runs]
                try:
                    results = yield TrimRound(tuple(run.trim for run in trims if run.trim))
                except Exception as exc:  # noqa: BLE001 - the round failed as a whole
                    results = [exc] * len(trims)
                for run, result in zip(trims, results, strict=True):
                    run.trim = None
                    if isinstance(result, Exception):
                        run.fail(result)
                    else:
                        run.reply(result)
        finally:
            for run in runs:
                run.flow.close()

    def _publish_round(
        self, publishes: list[_Lockstep], entries: list[OutboxMessage]
    ) -> Generator[BatchOp, Any, None]:
        """One :class:`PublishRound` of ``entries``, one of each run of ``publishes``; each
        run gets its own entry's outcome."""
        try:
            outcomes: list[Exception | None] = yield PublishRound(tuple(entries))
        except Exception as exc:  # noqa: BLE001 - the round failed as a whole
            outcomes = [exc] * len(publishes)
        for run, outcome in zip(publishes, outcomes, strict=True):
            if outcome is None:
                run.reply(None)
            else:
                run.fail(outcome)

    def _unpublished(self, doc: Document | None) -> Document | None:
        """``doc`` (a copy that came with an event or a sweep page, or just loaded) without
        the entries this instance already published and trimmed, or published with their
        trim deferred: entries never change, so nothing needs reloading. Deferred first: a
        flush adds what it trimmed to :attr:`trimmed` before it leaves the deferred."""
        if self.deferred is not None:
            doc = self.deferred.unpublished(doc)
        return self.trimmed.unpublished(doc)

    def _publish_flow(
        self, doc: Document, partition: int, generation: int
    ) -> Generator[RunOp, Any, DispatchResult | None]:
        """:func:`dispatch_document`, stopped (None) once the partition is no longer held."""
        flow = dispatch_document(
            doc,
            self.config.policy,
            self._rng,
            self._values,
            self._clock(),
            self.config.publish_references,
        )
        send: Any = None
        error: Exception | None = None
        while True:
            try:
                op = flow.send(send) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: DispatchResult = stop.value
                return result
            send, error = None, None
            if isinstance(op, Publish | Write) and not self.ownership.valid(partition):
                flow.close()  # the partition's next owner sweeps it
                log.info("dispatch_abandoned partition=%d reason=lease", partition)
                return None
            if isinstance(op, Publish):
                try:
                    yield op
                except Exception as exc:  # noqa: BLE001 - thrown into the flow, which classifies it
                    error = self._publish_failed(op.entry, exc)
                else:
                    self._published(op.entry)
            elif isinstance(op, Quarantine):
                yield op
                entry_id = op.entry.get("id")
                entry_id = entry_id if isinstance(entry_id, str) else None
                self.metrics.quarantined(op.aggregate_id, entry_id, op.error)
                log.error(
                    "quarantined aggregate=%r entry=%s attempts=%d error=%s",
                    op.aggregate_id,
                    entry_id,
                    op.attempts,
                    op.error,
                )
            elif self._deferred_trim(op, generation):
                send = True  # written behind the publishes; this run goes on
            else:
                try:
                    send = yield op
                except (StoreError, PayloadMissing) as exc:
                    error = exc
                else:
                    if send and isinstance(op, Write) and isinstance(op.plan, TrimPlan):
                        self.trimmed.add(doc, op.plan.entry_ids)

    # -- deferred trims (:mod:`~docoutbox.dispatch.engine.deferred`) ----------------------

    def _deferred_trim(self, op: RunOp, generation: int) -> bool:
        """Whether the run's trim ``op`` was handed over to be written behind its publishes
        (False: not a trim, deferral is off, the trim frees payloads, or the bound is
        reached: the run writes it)."""
        if self.deferred is None or not isinstance(op, Write):
            return False
        if not isinstance(op.plan, TrimPlan) or op.plan.payloads:
            # Rule: a payload is deleted only once its entry's trim committed, so the run
            # writes a trim that frees payloads itself, and deletes them after it.
            return False
        completed = self.queue.completed(op.plan.aggregate_id)
        return self.deferred.add(op.plan, generation, completed, self._mono())

    def trims_due(self) -> bool:
        """Whether a flush of the deferred trims should start now."""
        return self.deferred is not None and self.deferred.due(self._mono())

    def trims_pending(self) -> int:
        """Published entries whose deferred trim is not written yet."""
        return 0 if self.deferred is None else self.deferred.untrimmed()

    def trim_deferred(self, aggregate_id: AggregateId) -> bool:
        """Whether entries of the aggregate wait for a deferred trim."""
        return self.deferred is not None and self.deferred.holds(aggregate_id)

    def flush_trims(self) -> Generator[BatchOp, Any, int]:
        """Write every deferred trim in one :class:`TrimRound`; how many plans it held.

        Runs on the driver's own flush worker, at most one at a time. A plan that fails
        waits for the next flush. What was trimmed is remembered (:attr:`trimmed`) before
        it leaves the deferred trims, so that no copy read before the trim publishes it
        again. The entries of a partition lost meanwhile are trimmed all the same: they
        were published (I3), and their next owner need not publish them again.
        """
        deferred = self.deferred
        if deferred is None:
            return 0
        plans = deferred.take()
        if not plans:
            return 0
        try:
            results: list[Any] = yield TrimRound(tuple(plans))
        except Exception as exc:  # noqa: BLE001 - the round failed as a whole
            results = [exc] * len(plans)
        now = self._mono()
        for plan, result in zip(plans, results, strict=True):
            if isinstance(result, Exception):
                log.warning("trim_failed aggregate=%r error=%r", plan.aggregate_id, result)
            else:
                self.trimmed.add({ID: plan.aggregate_id}, plan.entry_ids)
            deferred.written(plan, result, now)
        return len(plans)

    def _publish_failed(self, entry: OutboxMessage, exc: Exception) -> Exception:
        self.metrics.failed(entry, exc)
        if isinstance(exc, BrokerUnavailable):
            self.broker.down(exc)
        else:
            log.warning(
                "publish_failed aggregate=%r entry=%s seq=%d error=%r",
                entry.aggregate_id,
                entry.id,
                entry.seq,
                exc,
            )
        return exc

    def _published(self, entry: OutboxMessage) -> None:
        self.broker.up()
        if self._timed:  # the lag costs a clock read per entry
            self.metrics.published(entry, (self._clock() - entry.created_at).total_seconds())
