"""How each operation of the dispatch loop maps onto the ports, sync and async; and the
group commit that writes the trims of concurrent runs in one round trip.

:class:`Ports` and :class:`AsyncPorts` bundle what a driver talks to; their ``perform``
carries out one :data:`~docoutbox.dispatch.engine.loop.EngineOp`. Drivers add only their own
concerns (stopping during a sleep, abandoning work after a crash).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.flow import Publish, Quarantine
from docoutbox.dispatch.engine.loop import (
    CloseStream,
    DispatchEngine,
    DispatcherConfig,
    EngineOp,
    FindDue,
    LoadCheckpoint,
    OpenStream,
    PollChanges,
    PublishRound,
    SaveCheckpoint,
    StartMarker,
    TrimRound,
)
from docoutbox.dispatch.engine.metrics import Metrics
from docoutbox.errors import BrokerUnavailable, InvalidConfig, PublishError, StoreError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import (
    AnnouncingOwnership,
    AsyncChangeSource,
    AsyncCheckpoints,
    AsyncDeadLetters,
    AsyncPipelinedPublisher,
    AsyncPublisher,
    ChangeSource,
    Checkpoints,
    DeadLetters,
    LanedSource,
    Ownership,
    PipelinedPublisher,
    Publisher,
)
from docoutbox.ports.payloads import (
    AsyncClaimedByDeadLetters,
    AsyncPayloadStore,
    ClaimedByDeadLetters,
    PayloadStore,
)
from docoutbox.ports.store import (
    AsyncBatchWriter,
    AsyncStoreBackend,
    BatchWriter,
    DispatchBackend,
    DueBackend,
    StoreBackend,
)
from docoutbox.store.core import FindPending, Load, Write
from docoutbox.store.document import utcnow
from docoutbox.store.plans import WritePlan
from docoutbox.stored.claim import (
    DeletePayloads,
    GetPayload,
    is_async_store,
    perform_payload,
    perform_payload_async,
)
from docoutbox.stored.sweep import DeadLettered

#: What a dispatcher calls on each of its ports (sync or async alike): the Protocols of
#: the sync and async twins share their method names.
_PORT_CHECKS: dict[str, tuple[tuple[type, ...], str]] = {
    "backend": ((DispatchBackend,), "load(), write(), find_pending()"),
    "publisher": ((Publisher, AsyncPublisher), "publish()"),
    "dead_letters": ((DeadLetters, AsyncDeadLetters), "put()"),
    "source": ((ChangeSource, AsyncChangeSource), "start_marker(), open(), poll(), close()"),
    "checkpoints": ((Checkpoints, AsyncCheckpoints), "load(), save()"),
}


def check_ports(ports: Ports | AsyncPorts) -> None:
    """:class:`InvalidConfig` for a port that lacks a method the dispatcher calls (say, a
    ``None`` publisher), instead of an ``AttributeError`` on its first run."""
    given = {
        "backend": ports.backend,
        "publisher": ports.publisher,
        "dead_letters": ports.dead_letters,
        "source": ports.source,
        "checkpoints": ports.checkpoints,
    }
    for name, (protocols, methods) in _PORT_CHECKS.items():
        port = given[name]
        if port is None and name in ("source", "checkpoints"):
            continue  # optional: polling mode, no checkpoint
        if not isinstance(port, protocols):
            raise InvalidConfig(
                f"the dispatcher's {name} must have {methods}: got {type(port).__name__}"
            )


@dataclass
class Ports:
    backend: StoreBackend
    publisher: Publisher
    dead_letters: DeadLetters
    source: ChangeSource | None = None
    checkpoints: Checkpoints | None = None
    #: Where claim-checked payloads are (None: no claim check).
    payloads: PayloadStore | None = None
    #: Whether the publisher keeps several entries in flight (checked once, here).
    pipelined: bool = field(init=False, default=False)
    #: Whether the backend finds documents with scheduled entries fallen due.
    due: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        check_ports(self)
        check_payloads(self.payloads, asynchronous=False)
        self.pipelined = isinstance(self.publisher, PipelinedPublisher)
        self.due = isinstance(self.backend, DueBackend)

    def perform(self, op: EngineOp) -> Any:
        """Carry out ``op`` (a :class:`Sleep` is the driver's: it is not handled here)."""
        if isinstance(op, Publish):
            return self.publisher.publish(op.entry)
        if isinstance(op, GetPayload | DeletePayloads):
            return perform_payload(op, self.payloads)
        if isinstance(op, DeadLettered):
            letters = self.dead_letters
            return isinstance(letters, ClaimedByDeadLetters) and letters.refers_to(op.payload_id)
        if isinstance(op, PublishRound):
            return self.publish_round(op.entries)
        if isinstance(op, TrimRound):  # drivers group these (GroupWriter): one by one here
            return [_settle(self.backend.write, plan) for plan in op.plans]
        if isinstance(op, Write):
            return self.backend.write(op.plan)
        if isinstance(op, Load):
            return self.backend.load(op.aggregate_id)
        if isinstance(op, FindPending):
            return self.backend.find_pending(
                after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
            )
        if isinstance(op, FindDue):
            assert isinstance(self.backend, DueBackend), "a due query without find_due"
            return self.backend.find_due(
                due_before=op.due_before, after=op.after, limit=op.limit, partitions=op.partitions
            )
        if isinstance(op, Quarantine):
            return self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
        if isinstance(op, PollChanges | OpenStream | StartMarker | CloseStream):
            assert self.source is not None, "a stream operation without a change source"
            if isinstance(op, PollChanges):
                return self.source.poll(op.max_events)
            if isinstance(op, OpenStream):
                return self.source.open(op.position)
            if isinstance(op, StartMarker):
                return self.source.start_marker()
            return self.source.close()
        if isinstance(op, LoadCheckpoint | SaveCheckpoint):
            assert self.checkpoints is not None, "a checkpoint operation without checkpoints"
            if isinstance(op, LoadCheckpoint):
                return self.checkpoints.load(op.name)
            return self.checkpoints.save(op.name, op.position)
        raise TypeError(f"not a dispatch operation: {op!r}")

    def publish_round(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """One outcome per entry: with confirms in flight where the publisher pipelines,
        else one publish after another (after the broker is found unreachable, the rest
        are not tried: each is reported unavailable and stays pending)."""
        if self.pipelined:
            assert isinstance(self.publisher, PipelinedPublisher)
            return checked_outcomes(self.publisher.publish_many(entries), len(entries))
        outcomes: list[Exception | None] = []
        for entry in entries:
            if outcomes and isinstance(outcomes[-1], BrokerUnavailable):
                outcomes.append(not_tried(outcomes[-1]))
                continue
            try:
                self.publisher.publish(entry)
            except Exception as exc:  # noqa: BLE001 - this entry's outcome, handed to its run
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes


def check_payloads(payloads: object, *, asynchronous: bool) -> None:
    """:class:`InvalidConfig` for a payload store that is not one, or of the wrong kind
    (an async one for a threaded dispatcher, or the reverse)."""
    if payloads is None:
        return
    if not isinstance(payloads, PayloadStore | AsyncPayloadStore):
        raise InvalidConfig(
            f"the dispatcher's payloads must be a payload store, got {type(payloads).__name__}"
        )
    if is_async_store(payloads) != asynchronous:
        kind = "an async" if asynchronous else "a sync"
        raise InvalidConfig(
            f"the dispatcher's payloads must be {kind} payload store, got {type(payloads).__name__}"
        )


def not_tried(cause: BrokerUnavailable) -> BrokerUnavailable:
    return BrokerUnavailable(f"not sent, the broker is unavailable: {cause}")


def checked_outcomes(outcomes: object, count: int) -> list[Exception | None]:
    """A ``publish_many`` reply, if it is one outcome (None or an exception) per entry;
    else :class:`PublishError` (whether anything was sent is unknown: it is sent again)."""
    if (
        isinstance(outcomes, list)
        and len(outcomes) == count
        and all(o is None or isinstance(o, Exception) for o in outcomes)
    ):
        return outcomes
    raise PublishError(
        f"publish_many must return one outcome (None or an exception) per entry, for "
        f"{count} entries: got {outcomes!r:.200}"
    )


@dataclass
class AsyncPorts:
    backend: AsyncStoreBackend
    publisher: AsyncPublisher
    dead_letters: AsyncDeadLetters
    source: AsyncChangeSource | None = None
    checkpoints: AsyncCheckpoints | None = None
    payloads: AsyncPayloadStore | None = None
    #: Whether the publisher keeps several entries in flight (checked once, here).
    pipelined: bool = field(init=False, default=False)
    #: Whether the backend finds documents with scheduled entries fallen due.
    due: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        check_ports(self)
        check_payloads(self.payloads, asynchronous=True)
        self.pipelined = isinstance(self.publisher, AsyncPipelinedPublisher)
        self.due = isinstance(self.backend, DueBackend)

    async def perform(self, op: EngineOp) -> Any:
        """The async twin of :meth:`Ports.perform`."""
        if isinstance(op, Publish):
            return await self.publisher.publish(op.entry)
        if isinstance(op, GetPayload | DeletePayloads):
            return await perform_payload_async(op, self.payloads)
        if isinstance(op, DeadLettered):
            letters = self.dead_letters
            if isinstance(letters, AsyncClaimedByDeadLetters):
                return await letters.refers_to(op.payload_id)
            return False
        if isinstance(op, PublishRound):
            return await self.publish_round(op.entries)
        if isinstance(op, TrimRound):  # drivers group these (AsyncGroupWriter)
            return [await _settle_async(self.backend.write, plan) for plan in op.plans]
        if isinstance(op, Write):
            return await self.backend.write(op.plan)
        if isinstance(op, Load):
            return await self.backend.load(op.aggregate_id)
        if isinstance(op, FindPending):
            return await self.backend.find_pending(
                after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
            )
        if isinstance(op, FindDue):
            assert isinstance(self.backend, DueBackend), "a due query without find_due"
            return await self.backend.find_due(
                due_before=op.due_before, after=op.after, limit=op.limit, partitions=op.partitions
            )
        if isinstance(op, Quarantine):
            return await self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
        if isinstance(op, PollChanges | OpenStream | StartMarker | CloseStream):
            assert self.source is not None, "a stream operation without a change source"
            if isinstance(op, PollChanges):
                return await self.source.poll(op.max_events)
            if isinstance(op, OpenStream):
                return await self.source.open(op.position)
            if isinstance(op, StartMarker):
                return await self.source.start_marker()
            return await self.source.close()
        if isinstance(op, LoadCheckpoint | SaveCheckpoint):
            assert self.checkpoints is not None, "a checkpoint operation without checkpoints"
            if isinstance(op, LoadCheckpoint):
                return await self.checkpoints.load(op.name)
            return await self.checkpoints.save(op.name, op.position)
        raise TypeError(f"not a dispatch operation: {op!r}")

    async def publish_round(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The async twin of :meth:`Ports.publish_round`: a publisher that cannot pipeline
        gets the entries as concurrent ``publish`` calls (of different aggregates, as the
        driver's tasks already make them)."""
        if self.pipelined:
            assert isinstance(self.publisher, AsyncPipelinedPublisher)
            return checked_outcomes(await self.publisher.publish_many(entries), len(entries))
        return list(await asyncio.gather(*(self._publish_one(entry) for entry in entries)))

    async def _publish_one(self, entry: OutboxMessage) -> Exception | None:
        try:
            await self.publisher.publish(entry)
        except Exception as exc:  # noqa: BLE001 - this entry's outcome, handed to its run
            return exc
        return None


class _Queued:
    """A plan waiting in a group writer, and how its writer learns the outcome."""

    __slots__ = ("done", "error", "lead", "plan", "result", "waiter")

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan
        self.result = False
        self.error: Exception | None = None
        self.done = False
        #: Handed the next round: this writer writes what queued up meanwhile.
        self.lead = False
        #: On a writer's first plan, while the writer waits for a round: what wakes it.
        self.waiter: threading.Condition | None = None

    def outcome(self) -> bool | Exception:
        return self.error if self.error is not None else self.result


def _record(batch: list[_Queued], results: list[bool]) -> None:
    for item, ok in zip(batch, results, strict=True):
        item.result, item.done = ok, True


def _fail(batch: list[_Queued], exc: BaseException) -> None:
    """Every writer of a failed round sees its error (a :class:`StoreError` if the round
    was interrupted: it may or may not have been written)."""
    if not isinstance(exc, Exception):
        exc = StoreError(f"the write round was interrupted: {exc!r}")
    for item in batch:
        if not item.done:
            item.error, item.done = exc, True


def _one(outcomes: list[bool | Exception]) -> bool:
    [outcome] = outcomes
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


class _Rounds:
    """What both group writers share: the queue, who leads the next round, the counts.

    A writer brings one or more plans (``write_all``); they queue up together and go out
    in the same round. The reply is one outcome per plan: its result, or its error.
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        #: One round trip for several plans (:class:`BatchWriter`). Without it, grouping
        #: would only queue each run's trim behind the others': each plan is written on
        #: its own, concurrently (Cosmos DB has no multi-item write across partitions).
        self._many: Callable[[Sequence[WritePlan]], Any] | None = (
            backend.write_many if isinstance(backend, BatchWriter | AsyncBatchWriter) else None
        )
        self._direct = self._many is None
        self._queue: list[_Queued] = []
        self._writing = False
        #: Round trips made, and plans written: ``plans / batches`` is the batching gain.
        self.batches = 0
        self.plans = 0

    def _begin_round(self) -> list[_Queued]:
        self._writing = True
        batch, self._queue = self._queue, []
        self.batches += 1
        self.plans += len(batch)
        return batch

    def _hand_over(self) -> None:
        """After a round: the first writer queued meanwhile leads the next one."""
        if self._queue:
            self._queue[0].lead = True
        else:
            self._writing = False


class GroupWriter(_Rounds):
    """Trims of concurrent runs, written together: a group commit.

    A writer that finds no round in flight leads one: it writes everything queued in one
    ``write_many``. Writers arriving meanwhile queue up; when the round ends, the
    first of them leads the next round and the leader returns at once: no writer waits
    for rounds after its own. A backend without ``write_many`` gets each plan written on
    its own, concurrently (``direct_workers`` threads).
    """

    def __init__(self, backend: Any, *, direct_workers: int = 16) -> None:
        super().__init__(backend)
        self._lock = threading.Lock()
        self._direct_workers = direct_workers
        self._pool: ThreadPoolExecutor | None = None

    def write(self, plan: WritePlan) -> bool:
        return _one(self.write_all([plan]))

    def write_all(self, plans: Sequence[WritePlan]) -> list[bool | Exception]:
        if self._direct:
            return self._write_each(plans)
        items = [_Queued(plan) for plan in plans]
        first = items[0]
        with self._lock:
            self._queue.extend(items)
            if self._writing:
                # All of them go out in the round that takes the first. Each waiting
                # writer has its own condition: a round wakes only its own writers and
                # the next leader, not every writer queued behind it.
                first.waiter = threading.Condition(self._lock)
                first.waiter.wait_for(lambda: first.done or first.lead)
                if first.done:
                    return [item.outcome() for item in items]
            batch = self._begin_round()
        try:
            _record(batch, self._many([i.plan for i in batch]))  # type: ignore[misc]
        except BaseException as exc:
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            with self._lock:
                self._hand_over()
                for item in batch:
                    if item.waiter is not None:
                        item.waiter.notify()
                if self._queue and self._queue[0].waiter is not None:
                    self._queue[0].waiter.notify()
        return [item.outcome() for item in items]

    def _write_each(self, plans: Sequence[WritePlan]) -> list[bool | Exception]:
        if len(plans) == 1:
            return [_settle(self._backend.write, plans[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._direct_workers, "docoutbox-trim")
        return list(self._pool.map(partial(_settle, self._backend.write), plans))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _settle(write: Any, plan: WritePlan) -> bool | Exception:
    try:
        return bool(write(plan))
    except Exception as exc:  # noqa: BLE001 - the outcome of this plan, handed to its run
        return exc


async def _settle_async(write: Any, plan: WritePlan) -> bool | Exception:
    try:
        return bool(await write(plan))
    except Exception as exc:  # noqa: BLE001 - the outcome of this plan, handed to its run
        return exc


class AsyncGroupWriter(_Rounds):
    """The asyncio twin of :class:`GroupWriter` (at most ``direct_workers`` direct writes
    at once)."""

    def __init__(self, backend: Any, *, direct_workers: int = 16) -> None:
        super().__init__(backend)
        self._changed = asyncio.Event()
        self._slots = asyncio.Semaphore(direct_workers)

    async def write(self, plan: WritePlan) -> bool:
        return _one(await self.write_all([plan]))

    async def write_all(self, plans: Sequence[WritePlan]) -> list[bool | Exception]:
        if self._direct:
            return list(await asyncio.gather(*(self._settle(plan) for plan in plans)))
        items = [_Queued(plan) for plan in plans]
        first = items[0]
        self._queue.extend(items)
        if self._writing:
            while not (first.done or first.lead):
                await self._changed.wait()
            if first.done:
                return [item.outcome() for item in items]
        batch = self._begin_round()
        try:
            _record(batch, await self._many([i.plan for i in batch]))  # type: ignore[misc]
        except BaseException as exc:
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._hand_over()
            # Wake the waiters, and arm a fresh event for the next round.
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        return [item.outcome() for item in items]

    async def _settle(self, plan: WritePlan) -> bool | Exception:
        async with self._slots:
            try:
                return bool(await self._backend.write(plan))
            except Exception as exc:  # noqa: BLE001 - the outcome of this plan, to its run
                return exc


#: The shortest sleep of an idle control loop: a wait due now is one its turn could not
#: act on yet (say, a due query while the backlog is full).
MIN_IDLE_WAIT = 0.001


class IdleWait:
    """How long a driver's control loop sleeps after a turn that did nothing.

    Rule: until the engine's next timed work (:meth:`DispatchEngine.wake_in`), when every
    other source of work wakes the loop: the driver's own (runs finishing, flushes,
    nudges, a stop) and the ownership's scopes gained, which an
    :class:`~docoutbox.ports.dispatch.AnnouncingOwnership` announces (``wake`` is
    registered with it here). An ownership that does not announce them is looked at every
    ``poll_interval``, so the loop sleeps at most that long.
    """

    def __init__(self, engine: DispatchEngine, wake: Callable[[], None]) -> None:
        self._engine = engine
        ownership = engine.ownership
        self.announced = isinstance(ownership, AnnouncingOwnership)
        if isinstance(ownership, AnnouncingOwnership):
            ownership.on_acquired(wake)

    def seconds(self) -> float:
        wait = self._engine.wake_in()
        if not self.announced:
            wait = min(wait, self._engine.config.poll_interval)
        return max(wait, MIN_IDLE_WAIT)


def wall_clock_engine(
    config: DispatcherConfig | None,
    ownership: Ownership | None,
    source: object | None,
    checkpoints: bool,
    rng: random.Random | None,
    metrics: Metrics | None,
) -> DispatchEngine:
    """The engine as the threaded and asyncio drivers run it: on the wall clock. Without
    a ``config``, the defaults (polling mode without a change ``source``); without an
    ``ownership``, a sole owner."""
    stream = source is not None
    if config is not None and not isinstance(config, DispatcherConfig):
        raise InvalidConfig(f"config must be a DispatcherConfig, got {type(config).__name__}")
    if config is None:
        config = DispatcherConfig() if stream else DispatcherConfig.polling()
    merge = source.merge_positions if isinstance(source, LanedSource) else None
    if inspect.iscoroutinefunction(merge):
        merge = None  # the engine calls merge_positions in its own loop: it must be sync
    return DispatchEngine(
        config,
        ownership or SoleOwner(),
        merge_positions=merge,
        stream=stream,
        checkpoints=checkpoints,
        monotonic=time.monotonic,
        clock=utcnow,
        rng=rng or random.Random(),
        metrics=metrics,
    )
