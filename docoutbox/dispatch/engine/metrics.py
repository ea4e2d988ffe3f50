"""Dispatcher metrics hooks: published, failed, quarantined, backlog and lag.

Implement :class:`Metrics` to feed your monitoring system. :class:`NullMetrics` does
nothing, :class:`CountingMetrics` keeps thread-safe totals (handy in tests and for the
CLI's progress lines) and :class:`LoggingMetrics` logs those totals periodically.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from docoutbox.model import AggregateId, OutboxMessage

log = logging.getLogger("docoutbox.metrics")


class Metrics(Protocol):
    def published(self, entry: OutboxMessage, lag: float) -> None:
        """``entry`` was confirmed by the broker, ``lag`` seconds after it was committed."""
        ...

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        """A publish attempt of ``entry`` failed (it will be retried or quarantined)."""
        ...

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None: ...

    def backlog(self, aggregates: int) -> None:
        """How many aggregates are waiting to be dispatched."""
        ...


@runtime_checkable
class StreamLagMetrics(Protocol):
    """Optional beside :class:`Metrics`: how far behind its commit each change event was
    seen, in seconds (checked once, when a dispatcher is built)."""

    def stream_lag(self, seconds: float) -> None: ...


class NullMetrics:
    def published(self, entry: OutboxMessage, lag: float) -> None:
        return None

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        return None

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None:
        return None

    def backlog(self, aggregates: int) -> None:
        return None


@dataclass(frozen=True)
class Totals:
    published: int
    failed: int
    quarantined: int
    backlog: int
    max_lag: float
    last_lag: float


class CountingMetrics:
    """Totals since start (and the largest lag seen), safe to update from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published = self._failed = self._quarantined = self._backlog = 0
        self._max_lag = self._last_lag = self._window_lag = 0.0

    def published(self, entry: OutboxMessage, lag: float) -> None:
        with self._lock:
            self._published += 1
            self._last_lag = lag
            self._max_lag = max(self._max_lag, lag)
            self._window_lag = max(self._window_lag, lag)

    def recent_lag(self) -> float:
        """The largest lag of the entries published since the previous call (0 if none
        were: an idle dispatcher that caught up has no lag), for periodic lines."""
        with self._lock:
            lag, self._window_lag = self._window_lag, 0.0
        return lag

    def failed(self, entry: OutboxMessage, error: BaseException) -> None:
        with self._lock:
            self._failed += 1

    def quarantined(self, aggregate_id: AggregateId, entry_id: str | None, error: str) -> None:
        with self._lock:
            self._quarantined += 1

    def backlog(self, aggregates: int) -> None:
        with self._lock:
            self._backlog = aggregates

    def totals(self) -> Totals:
        with self._lock:
            return Totals(
                self._published,
                self._failed,
                self._quarantined,
                self._backlog,
                self._max_lag,
                self._last_lag,
            )


class LoggingMetrics(CountingMetrics):
    """:class:`CountingMetrics` that logs a ``progress`` line at most every ``every`` s."""

    def __init__(
        self, every: float = 10.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._every = every
        self._mono = monotonic
        self._next = monotonic() + every

    def backlog(self, aggregates: int) -> None:
        super().backlog(aggregates)
        now = self._mono()
        if now >= self._next:
            self._next = now + self._every
            self.report()

    def report(self) -> None:
        """Log the totals; ``lag_s`` is :meth:`recent_lag`, ``max_lag_s`` since start."""
        t = self.totals()
        log.info(
            "progress published=%d failed=%d quarantined=%d backlog=%d lag_s=%.3f max_lag_s=%.3f",
            t.published,
            t.failed,
            t.quarantined,
            t.backlog,
            self.recent_lag(),
            t.max_lag,
        )
