"""Run work per aggregate on a thread pool: concurrent across aggregates, serial within one.

``request(aggregate_id, partition)`` asks for one more run of the aggregate and returns a
:class:`Ticket`. Requests arriving while a run is under way are coalesced into a single
follow-up run. A ticket is done once a run that *started after the request* succeeded,
so a caller can tell when the work behind an event is complete.

A failed run is retried after an exponential, jittered delay; a run reporting the broker
unavailable pauses every run for a while. Nothing is ever dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from docoutbox.model import AggregateId
from docoutbox.retry import backoff

log = logging.getLogger("docoutbox.dispatcher")


class RunOutcome(Enum):
    DONE = "done"  # nothing left to do for what was requested
    RETRY = "retry"  # try this aggregate again after a delay
    UNAVAILABLE = "unavailable"  # the broker is down: pause everything, then retry
    STOPPED = "stopped"  # abandoned because the dispatcher is stopping


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``min(cap, base * 2**(n-1))`` times 0.5 to 1."""

    base: float = 0.1
    cap: float = 10.0

    def delay(self, failures: int, rng: random.Random) -> float:
        return backoff(failures, self.base, self.cap, rng, floor=0.5)


@dataclass(frozen=True)
class Ticket:
    aggregate_id: AggregateId
    generation: int


@dataclass
class _Agg:
    partition: int
    requested: int
    completed: int
    running: bool = False
    failures: int = 0


Run = Callable[[AggregateId, int], RunOutcome]


class AggregateScheduler:
    def __init__(
        self,
        run: Run,
        *,
        workers: int,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._run = run
        self._workers = workers
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._mono = monotonic
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="docoutbox-dispatch")
        self._aggs: dict[AggregateId, _Agg] = {}
        self._ready: deque[AggregateId] = deque()
        self._queued: set[AggregateId] = set()
        self._later: list[tuple[float, int, AggregateId]] = []
        self._tiebreak = itertools.count()
        self._generation = 0
        self._running = 0
        self._paused_until = 0.0
        self._outages = 0
        self._epoch = 0  # counts pauses; a run remembers the one it started in
        self._closed = False
        self._cond = threading.Condition()

    def request(self, aggregate_id: AggregateId, partition: int) -> Ticket:
        with self._cond:
            self._generation += 1
            gen = self._generation
            agg = self._aggs.get(aggregate_id)
            if agg is None:
                # Every earlier request of this aggregate completed (or it would be here).
                self._aggs[aggregate_id] = _Agg(partition, gen, gen - 1)
                self._enqueue(aggregate_id)
            else:
                agg.requested = gen
                if not agg.running and agg.failures == 0:
                    self._enqueue(aggregate_id)
            self._pump()
            return Ticket(aggregate_id, gen)

    def done(self, ticket: Ticket) -> bool:
        with self._cond:
            agg = self._aggs.get(ticket.aggregate_id)
            return agg is None or agg.completed >= ticket.generation

    def backlog(self) -> int:
        """Aggregates with a requested run not yet complete."""
        with self._cond:
            return len(self._aggs)

    @property
    def outages(self) -> int:
        """Consecutive broker outages seen (0 once a run succeeds); each one pauses longer."""
        with self._cond:
            return self._outages

    def idle(self) -> bool:
        with self._cond:
            return not self._aggs

    def pump(self) -> None:
        """Start runs that became due (retries, the end of a pause)."""
        with self._cond:
            self._pump()

    def wait(self, timeout: float) -> None:
        """Sleep until a run finishes or ``timeout`` passes."""
        with self._cond:
            self._cond.wait(timeout)

    def close(self) -> None:
        """Start nothing new; wait for the runs under way."""
        with self._cond:
            self._closed = True
        self._pool.shutdown(wait=True)

    def _pump(self) -> None:
        if self._closed:
            return
        now = self._mono()
        while self._later and self._later[0][0] <= now:
            _, _, aggregate_id = heapq.heappop(self._later)
            agg = self._aggs.get(aggregate_id)
            if agg is not None and not agg.running:
                self._enqueue(aggregate_id)
        if now < self._paused_until:
            return
        while self._ready and self._running < self._workers:
            aggregate_id = self._ready.popleft()
            self._queued.discard(aggregate_id)
            agg = self._aggs.get(aggregate_id)
            if agg is None or agg.running or agg.completed >= agg.requested:
                continue
            agg.running = True
            self._running += 1
            self._pool.submit(self._work, aggregate_id, agg.partition, agg.requested, self._epoch)

    def _enqueue(self, aggregate_id: AggregateId) -> None:
        if aggregate_id not in self._queued:
            self._queued.add(aggregate_id)
            self._ready.append(aggregate_id)

    def _work(self, aggregate_id: AggregateId, partition: int, generation: int, epoch: int) -> None:
        try:
            outcome = self._run(aggregate_id, partition)
        except Exception as exc:  # logged; the aggregate is retried, not dropped
            log.exception("dispatch_run_failed aggregate=%r error=%r", aggregate_id, exc)
            outcome = RunOutcome.RETRY
        with self._cond:
            self._running -= 1
            agg = self._aggs[aggregate_id]
            agg.running = False
            if outcome is RunOutcome.DONE:
                agg.completed = max(agg.completed, generation)
                agg.failures = 0
                self._outages = 0
                if agg.completed >= agg.requested:
                    del self._aggs[aggregate_id]
                else:
                    self._enqueue(aggregate_id)
            elif outcome is RunOutcome.UNAVAILABLE:
                # Not the aggregate's fault: it waits, like every other, for the pause to
                # end. Runs started before the pause began do not lengthen it.
                if epoch == self._epoch:
                    self._epoch += 1
                    self._outages += 1
                    pause = self._backoff.delay(self._outages, self._rng)
                    self._paused_until = self._mono() + pause
                self._enqueue(aggregate_id)
            elif outcome is RunOutcome.RETRY:
                agg.failures += 1
                due = self._mono() + self._backoff.delay(agg.failures, self._rng)
                heapq.heappush(self._later, (due, next(self._tiebreak), aggregate_id))
            self._pump()
            self._cond.notify_all()

    def next_due(self) -> float | None:
        """Seconds until the next delayed run may start, if any."""
        with self._cond:
            if not self._later and self._mono() >= self._paused_until:
                return None
            due = max(self._later[0][0] if self._later else 0.0, self._paused_until)
            return max(0.0, due - self._mono())
