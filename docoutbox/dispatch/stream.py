"""Follow a change stream from its checkpoint, and move the checkpoint safely (I5).

:class:`StreamFollower` opens the :class:`~docoutbox.dispatch.ports.ChangeSource` at the saved
position, hands every event's document to the dispatcher (which answers with a
completion check), and saves the position behind the completed prefix of events.

When there is no usable position (first start, history lost, a malformed token) it opens
the stream at a fresh marker taken *before* a full sweep, and the marker only becomes the
checkpoint once that sweep is complete (a :class:`~docoutbox.dispatch.checkpoint.Gate`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from docoutbox.dispatch.checkpoint import Done, Gate, PositionTracker
from docoutbox.dispatch.ports import ChangeSource, Checkpoints, Position
from docoutbox.dispatch.scheduler import Backoff
from docoutbox.errors import ChangeStreamLost, StoreError
from docoutbox.store.document import Document

log = logging.getLogger("docoutbox.dispatcher")

#: Called with each event's document; returns the check of the work it caused, if any.
Request = Callable[[Document | None], Done | None]


class StreamFollower:
    def __init__(
        self,
        source: ChangeSource,
        checkpoints: Checkpoints | None,
        name: str,
        *,
        request: Request,
        sweep_all: Callable[[Gate], None],
        batch_size: int,
        max_outstanding: int,
        checkpoint_interval: float,
        backoff: Backoff,
        rng: random.Random,
    ) -> None:
        self.source = source
        self.checkpoints = checkpoints
        self.name = name
        self._request = request
        self._sweep_all = sweep_all
        self._batch = batch_size
        self._max_outstanding = max_outstanding
        self._interval = checkpoint_interval
        self._backoff = backoff
        self._rng = rng
        self.tracker = PositionTracker()
        self.saved: Position | None = None
        self._loaded = checkpoints is None
        self._resume: Position | None = None
        self._open = False
        self._failures = 0
        self._retry_at = 0.0
        self._next_save = 0.0

    def step(self, now: float) -> bool:
        """Open the stream if needed, or poll one batch. True if anything happened."""
        if not self._open:
            if now < self._retry_at:
                return False
            self._start()
            return self._open
        if len(self.tracker) >= self._max_outstanding:
            return False
        try:
            events = self.source.poll(self._batch)
        except ChangeStreamLost as exc:
            log.warning("stream_lost error=%r; sweeping and restarting the stream", exc)
            self._resume, self._open = None, False
            return True
        except StoreError as exc:
            self._failed(exc)
            return False
        for event in events:
            done = self._request(event.document)
            if done is None:
                self.tracker.add(event.position)
            else:
                self.tracker.add(event.position, done)
        self._resume = self.tracker.latest
        return bool(events)

    def _start(self) -> None:
        try:
            if not self._loaded:
                assert self.checkpoints is not None
                self._resume = self.saved = self.checkpoints.load(self.name)
                self.tracker = PositionTracker(self._resume)
                self._loaded = True
            if self._resume is None:
                self._fresh_start()
            else:
                try:
                    self.source.open(self._resume)
                except ChangeStreamLost as exc:
                    log.warning("stream_position_unusable error=%r; sweeping", exc)
                    self._fresh_start()
        except StoreError as exc:
            self._failed(exc)
            return
        self._open, self._failures = True, 0
        log.info("stream_opened")

    def _fresh_start(self) -> None:
        """Open the stream at "now", and sweep everything owned with no grace period."""
        marker = self.source.start_marker()
        self.source.open(marker)
        gate = Gate()
        self.tracker.reset(marker, gate)
        self._resume = marker
        self._sweep_all(gate)

    def _failed(self, exc: StoreError) -> None:
        self._open = False
        self._failures += 1
        delay = self._backoff.delay(self._failures, self._rng)
        self._retry_at = time.monotonic() + delay
        log.warning("stream_unavailable error=%r retry_in_s=%.2f", exc, delay)

    def checkpoint(self, now: float, *, force: bool = False) -> None:
        """Save the position behind the completed prefix (at most every interval)."""
        self.tracker.advance()
        safe = self.tracker.safe
        if self.checkpoints is None or safe is None or safe == self.saved:
            return
        if now < self._next_save and not force:
            return
        try:
            self.checkpoints.save(self.name, safe)
        except StoreError as exc:
            log.warning("checkpoint_save_failed error=%r", exc)
            return
        self.saved = safe
        self._next_save = now + self._interval

    def close(self) -> None:
        try:
            self.source.close()
        except StoreError as exc:
            log.warning("stream_close_failed error=%r", exc)
