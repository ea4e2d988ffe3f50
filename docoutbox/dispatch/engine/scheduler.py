"""Which aggregate runs are due: concurrent across aggregates, serial within one (pure).

``request(aggregate_id, partition)`` asks for one more run of the aggregate and returns a
:class:`Ticket`. Requests arriving while a run is under way are coalesced into a single
follow-up run. A ticket is done once a run that *started after the request* succeeded,
so a caller can tell when the work behind an event is complete.

A failed run is retried after an exponential, jittered delay; a run reporting the broker
unavailable pauses every run for a while. Nothing is ever dropped.

The queue performs nothing: :meth:`AggregateQueue.start` hands out the runs that may begin
now and a driver reports each one back with :meth:`AggregateQueue.finish`. It is safe to
call from several threads.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
from collections import deque
from dataclasses import dataclass
from enum import Enum

from docoutbox.model import AggregateId
from docoutbox.retry import Backoff
from docoutbox.store.document import Document

__all__ = ["AggregateQueue", "Backoff", "RunOutcome", "RunSlot", "Ticket"]


class RunOutcome(Enum):
    DONE = "done"  # nothing left to do for what was requested
    RETRY = "retry"  # try this aggregate again after a delay
    UNAVAILABLE = "unavailable"  # the broker is down: pause everything, then retry
    STOPPED = "stopped"  # abandoned because the dispatcher is stopping


@dataclass(frozen=True)
class Ticket:
    aggregate_id: AggregateId
    generation: int


@dataclass(frozen=True)
class RunSlot:
    """One run handed out by :meth:`AggregateQueue.start`.

    ``document`` is the newest copy of the aggregate that came with a request since the
    last run began (None: load it).
    """

    aggregate_id: AggregateId
    partition: int
    generation: int
    epoch: int
    document: Document | None = None
    #: This run's number, unique in its queue: a run is finished once (:meth:`holds`).
    run: int = 0


@dataclass
class _Agg:
    partition: int
    requested: int
    completed: int
    running: bool = False
    #: The number of the run in progress (:attr:`RunSlot.run`), while ``running``.
    run: int = 0
    failures: int = 0
    document: Document | None = None


class AggregateQueue:
    def __init__(
        self, *, workers: int, backoff: Backoff | None = None, rng: random.Random | None = None
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._workers = workers
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._aggs: dict[AggregateId, _Agg] = {}
        self._ready: deque[AggregateId] = deque()
        self._queued: set[AggregateId] = set()
        self._later: list[tuple[float, int, AggregateId]] = []
        self._tiebreak = itertools.count()
        self._runs = itertools.count(1)
        self._generation = 0
        self._running = 0
        self._paused_until = 0.0
        self._outages = 0
        self._epoch = 0  # counts pauses; a run remembers the one it started in
        self._lock = threading.Lock()

    def request(
        self, aggregate_id: AggregateId, partition: int, document: Document | None = None
    ) -> Ticket:
        """Ask for a run; ``document``, if given, is the aggregate as of this request."""
        with self._lock:
            self._generation += 1
            gen = self._generation
            agg = self._aggs.get(aggregate_id)
            if agg is None:
                # Every earlier request of this aggregate completed (or it would be here).
                self._aggs[aggregate_id] = _Agg(partition, gen, gen - 1, document=document)
                self._enqueue(aggregate_id)
            else:
                agg.requested = gen
                agg.document = document
                if not agg.running and agg.failures == 0:
                    self._enqueue(aggregate_id)
            return Ticket(aggregate_id, gen)

    def drop_copies(self, partitions: frozenset[int] | None) -> None:
        """Forget the documents that came with requests in ``partitions`` (None: all), so
        their runs load the aggregate: a partition just (re)acquired may have been
        published and trimmed by another owner since those copies were read."""
        with self._lock:
            for agg in self._aggs.values():
                if partitions is None or agg.partition in partitions:
                    agg.document = None

    def done(self, ticket: Ticket) -> bool:
        with self._lock:
            agg = self._aggs.get(ticket.aggregate_id)
            return agg is None or agg.completed >= ticket.generation

    def completed(self, aggregate_id: AggregateId) -> int:
        """The generation up to which the aggregate's requests are done (every one, if it
        has none pending)."""
        with self._lock:
            agg = self._aggs.get(aggregate_id)
            return self._generation if agg is None else agg.completed

    def backlog(self) -> int:
        """Aggregates with a requested run not yet complete."""
        with self._lock:
            return len(self._aggs)

    def ready(self) -> int:
        """Aggregates whose run may start as soon as a worker is free."""
        with self._lock:
            return len(self._ready)

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    @property
    def outages(self) -> int:
        """Consecutive broker outages seen (0 once a run succeeds); each one pauses longer."""
        with self._lock:
            return self._outages

    def idle(self) -> bool:
        with self._lock:
            return not self._aggs

    def start(self, now: float, limit: int | None = None) -> list[RunSlot]:
        """The runs that may begin at ``now`` (at most ``limit``), marked as running."""
        slots: list[RunSlot] = []
        with self._lock:
            while self._later and self._later[0][0] <= now:
                _, _, aggregate_id = heapq.heappop(self._later)
                agg = self._aggs.get(aggregate_id)
                if agg is not None and not agg.running:
                    self._enqueue(aggregate_id)
            if now < self._paused_until:
                return slots
            while self._ready and self._running < self._workers:
                if limit is not None and len(slots) >= limit:
                    break
                aggregate_id = self._ready.popleft()
                self._queued.discard(aggregate_id)
                agg = self._aggs.get(aggregate_id)
                if agg is None or agg.running or agg.completed >= agg.requested:
                    continue
                agg.running, agg.run = True, next(self._runs)
                self._running += 1
                slot = RunSlot(
                    aggregate_id, agg.partition, agg.requested, self._epoch, agg.document, agg.run
                )
                agg.document = None
                slots.append(slot)
        return slots

    def holds(self, slot: RunSlot) -> bool:
        """Whether ``slot``'s run is in progress, so not finished yet."""
        with self._lock:
            agg = self._aggs.get(slot.aggregate_id)
            return agg is not None and agg.running and agg.run == slot.run

    def finish(self, slot: RunSlot, outcome: RunOutcome, now: float) -> None:
        with self._lock:
            self._running -= 1
            aggregate_id = slot.aggregate_id
            agg = self._aggs[aggregate_id]
            agg.running = False
            if outcome is RunOutcome.DONE:
                agg.completed = max(agg.completed, slot.generation)
                agg.failures = 0
                self._outages = 0
                if agg.completed >= agg.requested:
                    del self._aggs[aggregate_id]
                else:
                    self._enqueue(aggregate_id)
            elif outcome is RunOutcome.UNAVAILABLE:
                # Not the aggregate's fault: it waits, like every other, for the pause to
                # end. Runs started before the pause began do not lengthen it.
                if slot.epoch == self._epoch:
                    self._epoch += 1
                    self._outages += 1
                    self._paused_until = now + self._backoff.delay(self._outages, self._rng)
                self._enqueue(aggregate_id)
            elif outcome is RunOutcome.RETRY:
                agg.failures += 1
                due = now + self._backoff.delay(agg.failures, self._rng)
                heapq.heappush(self._later, (due, next(self._tiebreak), aggregate_id))

    def next_due(self, now: float) -> float | None:
        """Seconds until a delayed run may start or a pause ends, if any is waiting."""
        with self._lock:
            if not self._later and now >= self._paused_until:
                return None
            due = max(self._later[0][0] if self._later else 0.0, self._paused_until)
            return max(0.0, due - now)

    def _enqueue(self, aggregate_id: AggregateId) -> None:
        if aggregate_id not in self._queued:
            self._queued.add(aggregate_id)
            self._ready.append(aggregate_id)
