"""When the dispatcher next queries for scheduled entries fallen due (pure, thread-safe).

Rule (the bound): a query runs every ``interval`` seconds, and sooner at the earliest due
time the dispatcher has seen (a change event's ``earliest_due``, a run's entries left
for later), and at once after a partition or feed range is acquired. A due entry
therefore waits for its run at most ``interval`` plus one turn of the loop; the run
then publishes it. A timer lost to a race (two runs reporting at once) only falls back
on the periodic query.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from docoutbox.model import AggregateId
from docoutbox.store.schedule import EARLIEST_DUE, as_utc


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
        self._timer = math.inf
        self._lock = threading.Lock()
        #: Where the next page of an unfinished query starts (None: from the first).
        self.after: AggregateId | None = None

    def _next(self) -> float:
        return min(self._periodic, self._timer)

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
            self._timer = min(self._timer, at)

    def scanned(self, started: float, after: AggregateId | None) -> None:
        """A query that began at ``started`` (monotonic) is answered; ``after``: where
        the next page starts, if the page was full (then the next query is at once)."""
        with self._lock:
            self.after = after
            if after is not None:
                return
            self._periodic = started + self._interval
            if self._timer <= started:
                self._timer = math.inf
