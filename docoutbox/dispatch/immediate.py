"""Immediate dispatch: publish a commit's new entries right after the commit, in-process.

Rule: the immediate path is a shortcut, never the only way out. An entry it cannot
publish stays pending in its document, where the change stream and the sweep of the
regular :class:`~docoutbox.dispatch.dispatcher.Dispatcher` find it (I1); nothing is
acknowledged or trimmed that was not published first.

How it goes: the store calls :meth:`ImmediateDispatcher.offer` with every outcome that
added entries; a worker thread publishes them and trims them at once. Per aggregate it
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
:class:`SettledPublisher` to let young entries settle first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from docoutbox.dispatch.ports import Publisher
from docoutbox.errors import InvalidConfig
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.retry import MAX_COUNT, check_int, check_seconds
from docoutbox.store.api import AggregateStore
from docoutbox.store.core import Outcome
from docoutbox.store.document import utcnow
from docoutbox.store.ports import StoreBackend

log = logging.getLogger("docoutbox.immediate")

_STOP = object()


class Claims:
    """Which entries this process has published, is publishing, or has queued, by ID.

    The immediate path *reserves* a commit's entries when they are offered, so the other
    path waits for it instead of racing it; a reservation ends when the immediate path
    publishes the entry, fails to, or gives it up.

    Bounded: the newest ``size`` published IDs are remembered (an entry older than that
    is long trimmed, or will be published again at worst: at least once still holds).
    """

    def __init__(self, size: int = 100_000) -> None:
        self._size = size
        self._done: OrderedDict[str, None] = OrderedDict()
        self._inflight: dict[str, threading.Event] = {}
        self._reserved: set[str] = set()
        self._lock = threading.Lock()

    def reserve(self, entry_ids: Iterable[str]) -> None:
        with self._lock:
            for entry_id in entry_ids:
                if entry_id not in self._done and entry_id not in self._inflight:
                    self._inflight[entry_id] = threading.Event()
                    self._reserved.add(entry_id)

    def release(self, entry_ids: Iterable[str]) -> None:
        """End the reservations still held on ``entry_ids`` (nothing was published)."""
        for entry_id in entry_ids:
            with self._lock:
                held = entry_id in self._reserved
            if held:
                self.finish(entry_id, False)

    def claim(
        self, entry_id: str, *, reserved: bool = False
    ) -> Literal["mine", "done"] | threading.Event:
        """ "mine": publish it, then :meth:`finish`; "done": already published; an
        Event: another path is publishing it (or has it queued), wait and claim again.
        ``reserved``: the caller is the path that reserved the entry."""
        with self._lock:
            if entry_id in self._done:
                return "done"
            busy = self._inflight.get(entry_id)
            if busy is None:
                self._inflight[entry_id] = threading.Event()
                return "mine"
            if reserved and entry_id in self._reserved:
                self._reserved.discard(entry_id)
                return "mine"
            return busy

    def finish(self, entry_id: str, published: bool) -> None:
        with self._lock:
            event = self._inflight.pop(entry_id, None)
            self._reserved.discard(entry_id)
            if published:
                self._done[entry_id] = None
                while len(self._done) > self._size:
                    self._done.popitem(last=False)
        if event is not None:
            event.set()

    def publish(
        self,
        publisher: Publisher,
        entry: OutboxMessage,
        *,
        reserved: bool = False,
        wait: float = 30.0,
    ) -> bool:
        """Publish ``entry`` unless this process already did; True if *we* published it.

        Raises what the publisher raises. While another path holds the claim, waits for
        it (at most ``wait`` seconds each time, then publishes anyway: at least once).
        """
        while True:
            claim = self.claim(entry.id, reserved=reserved)
            if claim == "done":
                return False
            if isinstance(claim, threading.Event):
                if claim.wait(wait):
                    continue
                publisher.publish(entry)
                return True
            try:
                publisher.publish(entry)
            except BaseException:
                self.finish(entry.id, False)
                raise
            self.finish(entry.id, True)
            return True


class GuardedPublisher:
    """A publisher that skips entries this process's other path has published already."""

    def __init__(self, publisher: Publisher, claims: Claims) -> None:
        self.publisher = publisher
        self.claims = claims
        self.skipped = 0

    def publish(self, entry: OutboxMessage) -> None:
        if not self.claims.publish(self.publisher, entry):
            self.skipped += 1


def _check_publisher(publisher: object) -> None:
    if not callable(getattr(publisher, "publish", None)):
        raise InvalidConfig(f"a publisher needs a publish method, got {type(publisher).__name__}")


class SettledPublisher:
    """For a dispatcher in another process than the immediate path: an entry younger than
    ``settle`` seconds is published only once it is that old and still pending.

    An entry gone from its document was trimmed, and a trim follows a publish (I3), so it
    counts as published. Costs one load per young entry, and ``settle`` seconds of latency
    on the safety net (which then only carries what the immediate path failed to do).
    ``created_at`` comes from the producer's clock: keep ``settle`` well above clock skew.
    """

    def __init__(
        self,
        publisher: Publisher,
        backend: StoreBackend,
        settle: float = 0.5,
        *,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        _check_publisher(publisher)
        self.publisher = publisher
        self.backend = backend
        self.settle = check_seconds("SettledPublisher.settle", settle)
        self._clock = clock
        self._sleep = sleep
        self.skipped = 0

    def publish(self, entry: OutboxMessage) -> None:
        age = (self._clock() - entry.created_at).total_seconds()
        if age < self.settle:
            self._sleep(self.settle - age)
            doc = self.backend.load(entry.aggregate_id)
            outbox = (doc or {}).get("outbox") or ()
            if not any(e.get("id") == entry.id for e in outbox):
                self.skipped += 1
                return
        self.publisher.publish(entry)


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


class ImmediateDispatcher:
    """Publishes and trims a sync store's new entries right after each commit.

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
        _check_publisher(publisher)
        check_int("ImmediateDispatcher.max_queue", max_queue, 0, MAX_COUNT)
        check_int("ImmediateDispatcher.max_batch", max_batch, 1, MAX_COUNT)
        self.store = store
        self.publisher = publisher
        self.claims = claims or Claims()
        self.stats = ImmediateStats()
        #: Queued commits the worker takes at once (one trim per aggregate among them).
        self.max_batch = max_batch
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        #: The last seq published per aggregate (the most recently active ones).
        self._upto: OrderedDict[AggregateId, int] = OrderedDict()
        self._upto_size = 100_000
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
        """Detach, finish what is queued, and stop the worker."""
        if self._thread is None:
            return
        if self.offer in self.store.commit_listeners:
            self.store.commit_listeners.remove(self.offer)
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def offer(self, outcome: Outcome[Any]) -> None:
        """Queue a commit's new entries; called by the store after the commit."""
        self.stats.offered += len(outcome.entries)
        entries = outcome.emitted
        self.claims.reserve(e.id for e in entries)
        try:
            self._queue.put_nowait((outcome.aggregate_id, entries))
        except queue.Full:
            self.claims.release(e.id for e in entries)
            self.stats.deferred += len(entries)

    def drain(self) -> None:
        """Wait until everything offered so far has been handled (for tests and shutdown)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._work(batch):
                return

    def _work(self, batch: list[Any]) -> bool:
        """Publish everything queued, per aggregate in seq order, then trim each aggregate
        once. True when a stop was queued."""
        stop = False
        drained: list[threading.Event] = []
        work: OrderedDict[AggregateId, dict[str, OutboxMessage]] = OrderedDict()
        for item in batch:
            if item is _STOP:
                stop = True
            elif isinstance(item, threading.Event):
                drained.append(item)
            else:
                aggregate_id, entries = item
                work.setdefault(aggregate_id, {}).update((e.id, e) for e in entries)
        published: list[tuple[AggregateId, list[str]]] = []
        for aggregate_id, by_id in work.items():
            entries = sorted(by_id.values(), key=lambda e: e.seq)
            done: list[str] = []
            try:
                self._publish(aggregate_id, entries, done)
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
                self.store.trim(aggregate_id, done)
            except Exception as exc:  # noqa: BLE001 - published, untrimmed: republished later
                self.stats.errors.append(repr(exc))
                log.warning("immediate_trim_failed aggregate=%r error=%r", aggregate_id, exc)
        while len(self._upto) > self._upto_size:
            self._upto.popitem(last=False)
        for event in drained:
            event.set()
        return stop

    def _publish(
        self, aggregate_id: AggregateId, entries: list[OutboxMessage], done: list[str]
    ) -> None:
        """Publish ``entries`` after any pending ones below them, appending to ``done``."""
        upto = self._upto.get(aggregate_id, 0)
        todo = [e for e in entries if e.seq > upto]
        if not todo:
            return
        if todo[0].seq != upto + 1:
            self.stats.reloads += 1
            snapshot = self.store.load(aggregate_id)
            pending = [] if snapshot is None else list(snapshot.outbox)
            below = [e for e in pending if e.seq < todo[0].seq]
            todo = below + todo
        try:
            for entry in todo:
                if self.claims.publish(self.publisher, entry, reserved=True):
                    self.stats.published += 1
                else:
                    self.stats.skipped += 1
                done.append(entry.id)
                self._upto[aggregate_id] = entry.seq
                self._upto.move_to_end(aggregate_id)
        except Exception:
            self.stats.deferred += len(todo) - len(done)
            raise
