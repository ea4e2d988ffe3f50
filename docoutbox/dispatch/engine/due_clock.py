"""When the dispatcher next queries for scheduled entries fallen due (pure, thread-safe).

Rule (the bound): a query runs every ``interval`` seconds, and sooner at each due time
the dispatcher has seen (a change event's ``earliest_due``, a run's entries left for
later; at most :data:`MAX_TIMERS` of them, the rest wait for the periodic query), and at
once after a partition or feed range is acquired. A due entry therefore waits for its
run at most ``interval`` plus one turn of the loop, and usually one turn; the run then
publishes it.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from docoutbox.model import AggregateId
from docoutbox.store.schedule import EARLIEST_DUE, as_utc

#: Due times remembered at once; beyond them, entries wait for the periodic query.
MAX_TIMERS = 10_000


class DueClock:
    def __init__(
        self,
        interval: float,
        monotonic: Callable[[], float],
        clock: Callable[[], datetime],
    ) -> None:
        self._interval = interval
        self._mono = monotonic
        self._clock = clock
        self._periodic = -math.inf  # the first turn queries at once
        #: Monotonic times to query at, earliest first.
        self._timers: list[float] = []
        self._lock = threading.Lock()
        #: Where the next page of an unfinished query starts (None: from the first).
        self.after: AggregateId | None = None

    def _next(self) -> float:
        return min(self._periodic, self._timers[0]) if self._timers else self._periodic

    def ready(self, now: float) -> bool:
        """Whether to query now."""
        with self._lock:
            return now >= self._next()

    def wait(self, now: float) -> float:
        """Seconds until the next query."""
        with self._lock:
            return max(0.0, self._next() - now)

    def soon(self) -> None:
        """Query at the next turn (a scope was acquired)."""
        with self._lock:
            self._periodic = -math.inf
            self.after = None

    def note(self, doc: dict[str, Any] | None) -> None:
        """Learn a document's due-time hint (from a change event)."""
        if doc:
            self.expect(as_utc(doc.get(EARLIEST_DUE)))

    def expect(self, due: datetime | None) -> None:
        """Query again at ``due`` (None: nothing to expect)."""
        if due is None:
            return
        delay = max(0.0, (due - self._clock()).total_seconds())
        at = self._mono() + delay
        with self._lock:
            if len(self._timers) < MAX_TIMERS:
                heapq.heappush(self._timers, at)

    def scanned(self, started: float, after: AggregateId | None) -> None:
        """A query that began at ``started`` (monotonic) is answered; ``after``: where
        the next page starts, if the page was full (then the next query is at once)."""
        with self._lock:
            self.after = after
            if after is not None:
                return
            self._periodic = started + self._interval
            while self._timers and self._timers[0] <= started:
                heapq.heappop(self._timers)
