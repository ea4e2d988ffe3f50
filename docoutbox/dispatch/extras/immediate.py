"""Immediate dispatch: publish a commit's new entries right after the commit, in-process.

Rule: the immediate path is a shortcut, never the only way out. It never publishes a
scheduled entry: those wait in their document for the regular dispatcher. An entry it cannot
publish stays pending in its document, where the change stream and the sweep of the
regular :class:`~docoutbox.dispatch.drivers.threads.Dispatcher` find it (I1); nothing is
acknowledged or trimmed that was not published first.

How it goes: the store calls :meth:`ImmediateDispatcher.offer` with every outcome that
added entries; a worker thread publishes them and trims them at once.
:class:`AsyncImmediateDispatcher` does the same for an async store, with a task on the
event loop; both drive one sans-IO flow (``_Immediate._work``). Per aggregate it
publishes in ``seq`` order (I4): it remembers the last ``seq`` it finished, and when a
commit's first entry does not follow it (a commit of another process, an entry left by a
crash, a failed publish), it reloads the document and publishes every pending entry below
first. After a failed publish it stops for that aggregate and leaves the rest to the safety
net.

Both paths publishing the same entry is a duplicate (harmless to a de-duplicating
receiver, but traffic). Within one process :class:`Claims` prevents it: wrap the regular
dispatcher's publisher with :meth:`ImmediateDispatcher.guard`, and an entry is published
by whichever path claims it first; the other waits for the outcome and, on success, only
trims. Across processes the two paths race for every entry the change stream reports
before the immediate path has trimmed it; wrap the other process's publisher with
:class:`~docoutbox.dispatch.extras.settled.SettledPublisher` to let young entries settle first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from docoutbox.dispatch.engine.due import unreleased
from docoutbox.dispatch.engine.flow import Publish
from docoutbox.dispatch.extras.claims import (
    AsyncGuardedPublisher,
    Claims,
    GuardedPublisher,
    WaitClaim,
    claimed_publish,
)
from docoutbox.drive import drive, drive_async
from docoutbox.errors import InvalidConfig
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.ports.dispatch import AsyncPublisher, Publisher, check_publisher
from docoutbox.retry import MAX_COUNT, check_int, check_seconds
from docoutbox.store.api import AggregateStore, AsyncAggregateStore
from docoutbox.store.core import Outcome
from docoutbox.store.schedule import due_of

log = logging.getLogger("docoutbox.immediate")

_STOP = object()


@dataclass(frozen=True)
class Reload:
    """Load the aggregate: its pending entries below a commit's first seq go first."""

    aggregate_id: AggregateId


@dataclass(frozen=True)
class Trim:
    """Remove the published entries from the aggregate's outbox."""

    aggregate_id: AggregateId
    entry_ids: list[str]


ImmediateOp = Publish | WaitClaim | Reload | Trim


def _emptied(get_nowait: Callable[[], Any], empty: type[Exception]) -> Iterator[Any]:
    """Every item still in a queue, taken without waiting."""
    while True:
        try:
            yield get_nowait()
        except empty:
            return


@dataclass(frozen=True)
class Drained:
    """A mark queued by ``drain()``: ``reached`` is called once everything before it was
    handled."""

    reached: Callable[[], None]


@dataclass
class ImmediateStats:
    offered: int = 0
    published: int = 0
    #: Entries the other path had published already: trimmed only.
    skipped: int = 0
    #: Entries left to the safety net (failed publish, full queue, failed trim).
    deferred: int = 0
    #: Reloads to publish pending entries below a commit's first seq.
    reloads: int = 0
    errors: list[str] = field(default_factory=list)


class _Immediate:
    """What both drivers share: the claims, the counts, the last seq per aggregate, and
    the flow that handles one batch of queued commits."""

    def __init__(self, claims: Claims | None, max_queue: int, max_batch: int) -> None:
        cls = type(self).__name__
        check_int(f"{cls}.max_queue", max_queue, 0, MAX_COUNT)
        check_int(f"{cls}.max_batch", max_batch, 1, MAX_COUNT)
        self.claims = claims or Claims()
        self.stats = ImmediateStats()
        #: Queued commits the worker takes at once (one trim per aggregate among them).
        self.max_batch = max_batch
        #: The last seq published per aggregate (the most recently active ones).
        self._upto: OrderedDict[AggregateId, int] = OrderedDict()
        self._upto_size = 100_000

    def _offered(self, outcome: Outcome[Any]) -> tuple[AggregateId, tuple[OutboxMessage, ...]]:
        """Count and reserve a commit's new entries: the item to queue. Scheduled entries
        are left to the regular dispatcher, which publishes them once due."""
        later = {raw["id"] for raw in outcome.entries if due_of(raw) is not None}
        entries = tuple(e for e in outcome.emitted if e.id not in later)
        self.stats.offered += len(entries)
        self.claims.reserve(e.id for e in entries)
        return outcome.aggregate_id, entries

    def _refused(self, item: tuple[AggregateId, tuple[OutboxMessage, ...]]) -> None:
        """The queue is full: the item's entries are left to the safety net."""
        self.claims.release(e.id for e in item[1])
        self.stats.deferred += len(item[1])

    def _abandon(self, items: Iterable[Any]) -> None:
        """What a stopped or dead worker left queued: its entries stay pending for the
        safety net, with their claims released (the other path would wait for them)."""
        for item in items:
            if isinstance(item, Drained):
                item.reached()
            elif item is not _STOP:
                self._refused(item)

    def _work(self, batch: list[Any]) -> Generator[ImmediateOp, Any, bool]:
        """Publish everything queued, per aggregate in seq order, then trim each aggregate
        once, then reach the batch's drain marks. Returns whether a stop was queued."""
        stop = False
        drained: list[Drained] = []
        work: OrderedDict[AggregateId, dict[str, OutboxMessage]] = OrderedDict()
        for item in batch:
            if item is _STOP:
                stop = True
            elif isinstance(item, Drained):
                drained.append(item)
            else:
                aggregate_id, entries = item
                work.setdefault(aggregate_id, {}).update((e.id, e) for e in entries)
        published: list[tuple[AggregateId, list[str]]] = []
        for aggregate_id, by_id in work.items():
            entries = sorted(by_id.values(), key=_seq)
            done: list[str] = []
            try:
                yield from self._publish(aggregate_id, entries, done)
            except Exception as exc:  # noqa: BLE001 - left pending: the safety net publishes it
                self._upto.pop(aggregate_id, None)
                self.stats.errors.append(repr(exc))
                log.warning("immediate_deferred aggregate=%r error=%r", aggregate_id, exc)
            finally:
                self.claims.release(e.id for e in entries)
            if done:
                published.append((aggregate_id, done))
        for aggregate_id, done in published:
            try:
                yield Trim(aggregate_id, done)
            except Exception as exc:  # noqa: BLE001 - published, untrimmed: republished later
                self.stats.errors.append(repr(exc))
                log.warning("immediate_trim_failed aggregate=%r error=%r", aggregate_id, exc)
        while len(self._upto) > self._upto_size:
            self._upto.popitem(last=False)
        for mark in drained:
            mark.reached()
        return stop

    def _publish(
        self, aggregate_id: AggregateId, entries: list[OutboxMessage], done: list[str]
    ) -> Generator[ImmediateOp, Any, None]:
        """Publish ``entries`` after any pending ones below them, appending to ``done``."""
        upto = self._upto.get(aggregate_id, 0)
        todo = [e for e in entries if _seq(e) > upto]
        if not todo:
            return
        if _seq(todo[0]) != upto + 1:
            self.stats.reloads += 1
            snapshot = yield Reload(aggregate_id)
            pending = [] if snapshot is None else _immediate(snapshot.raw_outbox, snapshot.outbox)
            below = [e for e in pending if _seq(e) < _seq(todo[0])]
            todo = below + todo
        try:
            for entry in todo:
                if (yield from claimed_publish(self.claims, entry, reserved=True, wait=30.0)):
                    self.stats.published += 1
                else:
                    self.stats.skipped += 1
                done.append(entry.id)
                self._upto[aggregate_id] = _seq(entry)
                self._upto.move_to_end(aggregate_id)
        except Exception:
            self.stats.deferred += len(todo) - len(done)
            raise


def _seq(entry: OutboxMessage) -> int:
    """An entry's ``seq``: every entry here has one (scheduled entries, numbered only when
    released, are left to the regular dispatcher)."""
    return entry.seq if entry.seq is not None else 0


def _immediate(
    raw: Iterable[dict[str, Any]], parsed: Iterable[OutboxMessage]
) -> list[OutboxMessage]:
    """The numbered entries of an outbox in ``seq`` order: immediate ones, and scheduled
    ones released already (stored before entries numbered ahead of them; their ``seq``
    places them, I4). Scheduled entries not released yet wait for the regular
    dispatcher, which numbers them once due."""
    numbered = [e for stored, e in zip(raw, parsed, strict=True) if not unreleased(stored)]
    return sorted(numbered, key=_seq)


class ImmediateDispatcher(_Immediate):
    """Publishes and trims a sync store's new entries right after each commit, on a
    worker thread.

    >>> immediate = ImmediateDispatcher(store, publisher).start()
    >>> dispatcher = Dispatcher(backend, immediate.guard(publisher), dead_letters, ...)
    >>> ...
    >>> immediate.stop()
    """

    def __init__(
        self,
        store: AggregateStore[Any],
        publisher: Publisher,
        *,
        claims: Claims | None = None,
        max_queue: int = 10_000,
        max_batch: int = 256,
    ) -> None:
        if not isinstance(store, AggregateStore):
            raise InvalidConfig(
                f"ImmediateDispatcher needs an AggregateStore, got {type(store).__name__}"
            )
        check_publisher(publisher)
        super().__init__(claims, max_queue, max_batch)
        self.store = store
        self.publisher = publisher
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._thread: threading.Thread | None = None

    def guard(self, publisher: Publisher) -> GuardedPublisher:
        """``publisher`` for the regular dispatcher, sharing this path's claims."""
        return GuardedPublisher(publisher, self.claims)

    def start(self) -> ImmediateDispatcher:
        """Attach to the store and start the worker thread."""
        if self._thread is not None:
            return self
        self.store.commit_listeners.append(self.offer)
        self._thread = threading.Thread(target=self._run, name="docoutbox-immediate", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Detach, finish what is queued, and stop the worker (waiting at most about
        ``timeout`` seconds for it)."""
        timeout = check_seconds("ImmediateDispatcher.stop timeout", timeout)
        if self._thread is None:
            return
        if self.offer in self.store.commit_listeners:
            self.store.commit_listeners.remove(self.offer)
        thread, self._thread = self._thread, None
        if thread.is_alive():
            with contextlib.suppress(queue.Full):  # a stuck worker: it keeps what it has
                self._queue.put(_STOP, timeout=timeout)
            thread.join(timeout)
        if not thread.is_alive():
            self._abandon(_emptied(self._queue.get_nowait, queue.Empty))

    def offer(self, outcome: Outcome[Any]) -> None:
        """Queue a commit's new entries; called by the store after the commit."""
        item = self._offered(outcome)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._refused(item)

    def drain(self) -> None:
        """Wait until everything offered so far has been handled (for tests and shutdown).
        Returns at once when the worker is not running, and as soon as it dies."""
        thread = self._thread
        done = threading.Event()
        queued = False
        while thread is not None and thread.is_alive():
            if not queued:
                try:
                    self._queue.put(Drained(done.set), timeout=0.05)
                except queue.Full:
                    continue
                queued = True
            if done.wait(0.05):
                return

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if drive(self._work(batch), self._perform):
                return

    def _perform(self, op: ImmediateOp) -> Any:
        if isinstance(op, Publish):
            return self.publisher.publish(op.entry)
        if isinstance(op, WaitClaim):
            return op.event.wait(op.timeout)
        if isinstance(op, Reload):
            return self.store.load(op.aggregate_id)
        return self.store.trim(op.aggregate_id, op.entry_ids)


class AsyncImmediateDispatcher(_Immediate):
    """The asyncio twin of :class:`ImmediateDispatcher`, for an
    :class:`~docoutbox.AsyncAggregateStore` and an async publisher: the worker is a task
    on the running event loop.

    >>> immediate = await AsyncImmediateDispatcher(store, publisher).start()
    >>> dispatcher = AsyncDispatcher(backend, immediate.guard(publisher), dead_letters, ...)
    >>> ...
    >>> await immediate.stop()
    """

    def __init__(
        self,
        store: AsyncAggregateStore[Any],
        publisher: AsyncPublisher,
        *,
        claims: Claims | None = None,
        max_queue: int = 10_000,
        max_batch: int = 256,
    ) -> None:
        if not isinstance(store, AsyncAggregateStore):
            raise InvalidConfig(
                f"AsyncImmediateDispatcher needs an AsyncAggregateStore, got {type(store).__name__}"
            )
        check_publisher(publisher, asynchronous=True)
        super().__init__(claims, max_queue, max_batch)
        self.store = store
        self.publisher = publisher
        self._queue: asyncio.Queue[Any] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None

    def guard(self, publisher: AsyncPublisher) -> AsyncGuardedPublisher:
        """``publisher`` for the regular dispatcher, sharing this path's claims."""
        return AsyncGuardedPublisher(publisher, self.claims)

    async def start(self) -> AsyncImmediateDispatcher:
        """Attach to the store and start the worker task on the running loop."""
        if self._task is not None:
            return self
        self.store.commit_listeners.append(self.offer)
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self, timeout: float = 10.0) -> None:
        """Detach, finish what is queued, and stop the worker (waiting at most about
        ``timeout`` seconds for it)."""
        timeout = check_seconds("AsyncImmediateDispatcher.stop timeout", timeout)
        if self._task is None:
            return
        if self.offer in self.store.commit_listeners:
            self.store.commit_listeners.remove(self.offer)
        task, self._task = self._task, None
        if not task.done():
            with contextlib.suppress(TimeoutError):  # a stuck worker: it keeps what it has
                await asyncio.wait_for(self._queue.put(_STOP), timeout)
            await asyncio.wait([task], timeout=timeout)
        if task.done():
            self._abandon(_emptied(self._queue.get_nowait, asyncio.QueueEmpty))
            if not task.cancelled() and task.exception() is not None:
                log.error("immediate_worker_failed error=%r", task.exception())

    def offer(self, outcome: Outcome[Any]) -> None:
        """Queue a commit's new entries; called by the store (on the loop) after the commit."""
        item = self._offered(outcome)
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self._refused(item)

    async def drain(self) -> None:
        """Wait until everything offered so far has been handled (for tests and shutdown).
        Returns at once when the worker is not running, and as soon as it dies."""
        task = self._task
        if task is None or task.done():
            return
        done = asyncio.Event()

        async def reached() -> None:
            await self._queue.put(Drained(done.set))
            await done.wait()

        waiter = asyncio.ensure_future(reached())
        try:
            await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            if await drive_async(self._work(batch), self._perform):
                return

    async def _perform(self, op: ImmediateOp) -> Any:
        if isinstance(op, Publish):
            return await self.publisher.publish(op.entry)
        if isinstance(op, WaitClaim):
            return await asyncio.to_thread(op.event.wait, op.timeout)
        if isinstance(op, Reload):
            return await self.store.load(op.aggregate_id)
        return await self.store.trim(op.aggregate_id, op.entry_ids)
