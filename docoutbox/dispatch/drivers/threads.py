"""The threaded dispatcher: turns committed outbox entries into confirmed publishes, then trims.

A thin driver of :class:`~docoutbox.dispatch.engine.loop.DispatchEngine`: the calling thread
runs the control loop (sweeps, stream, checkpoint), a pool of ``concurrency`` threads runs
batches of aggregate runs (concurrent across aggregates, serial per aggregate).

Call :meth:`Dispatcher.run` on a thread of your choice and :meth:`Dispatcher.stop` (for
example from a SIGTERM handler) to finish in-flight work, checkpoint and release leases.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from docoutbox.dispatch.drivers.latches import Latch, Wakeup
from docoutbox.dispatch.drivers.operations import (
    GroupWriter,
    IdleWait,
    Ports,
    wall_clock_engine,
)
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.checkpoint import describe_position
from docoutbox.dispatch.engine.flow import Publish
from docoutbox.dispatch.engine.loop import (
    DispatcherConfig,
    EngineOp,
    PublishRound,
    TrimRound,
    event_target,
)
from docoutbox.dispatch.engine.metrics import Metrics
from docoutbox.dispatch.engine.scheduler import RunOutcome, RunSlot
from docoutbox.drive import Abandoned, drive
from docoutbox.ports.dispatch import ChangeSource, Checkpoints, DeadLetters, Ownership, Publisher
from docoutbox.ports.payloads import PayloadStore
from docoutbox.ports.store import StoreBackend
from docoutbox.store.core import Sleep, Write

__all__ = ["Dispatcher", "DispatcherConfig", "event_target"]

log = logging.getLogger("docoutbox.dispatcher")


class Dispatcher:
    def __init__(
        self,
        backend: StoreBackend,
        publisher: Publisher,
        dead_letters: DeadLetters,
        *,
        source: ChangeSource | None = None,
        checkpoints: Checkpoints | None = None,
        ownership: Ownership | None = None,
        config: DispatcherConfig | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
        payloads: PayloadStore | None = None,
    ) -> None:
        self.engine = wall_clock_engine(
            config, ownership, source, checkpoints is not None, rng, metrics
        )
        self.config, self.ownership = self.engine.config, self.engine.ownership
        self.metrics = self.engine.metrics
        self.backend = backend
        self.source = source
        self.checkpoints = checkpoints
        self.ports = Ports(backend, publisher, dead_letters, source, checkpoints, payloads)
        self.engine.rounds = self.ports.pipelined
        self.engine.due_scans = self.ports.due
        #: Trims of concurrent runs go out together.
        self.trims = GroupWriter(backend, direct_workers=self.config.concurrency)
        #: Signal-safe (:mod:`~docoutbox.dispatch.drivers.latches`): :meth:`stop` may be
        #: called from a signal handler on the loop's own thread.
        self._stop = Latch()
        self._crashed = Latch()
        self._pool = ThreadPoolExecutor(self.config.concurrency, "docoutbox-dispatch")
        #: Writes the deferred trims, one flush at a time, off the workers' path.
        self._flusher = ThreadPoolExecutor(1, "docoutbox-trims")
        self._flushing = False
        self._lock = threading.Lock()
        self._busy = 0  # batches submitted and not finished
        self._closed = False
        self._wake = Wakeup()
        #: Set by :meth:`nudge`; the control loop reads the stream at its next turn.
        self._nudged = False
        #: How long an idle loop sleeps (until its next timed work).
        self._idle = IdleWait(self.engine, self._wake.set)
        self.started = threading.Event()

    def queued(self) -> int:
        """Aggregates this instance has in hand (its work queue, not the outbox backlog)."""
        return self.engine.queue.backlog()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def stream_open(self) -> bool | None:
        """Whether the change stream is open (None without a change source)."""
        return self.engine.stream_open

    def stop(self) -> None:
        """Stop taking work; :meth:`run` finishes in-flight work, checkpoints and returns.

        Safe to call from any thread, and from a signal handler: it takes no lock.
        """
        self._stop.set()
        self._wake.set()

    def halt(self) -> None:
        """Stop as abruptly as a crash: abandon work, no checkpoint, keep the leases."""
        self._crashed.set()
        self.stop()

    def nudge(self) -> None:
        """Read the change stream now, and start its waits over
        (:meth:`~docoutbox.dispatch.engine.loop.DispatchEngine.read_soon`): entries were
        just committed. A store's commit listener, say; safe to call from any thread."""
        self._nudged = True
        self._wake.set()

    def run(self) -> None:
        cfg = self.config
        log.info(
            "dispatcher_started name=%s partitions=%d concurrency=%d stream=%s",
            cfg.name,
            cfg.partitions,
            cfg.concurrency,
            self.source is not None,
        )
        if not isinstance(self.ownership, SoleOwner):
            drive(self.engine.check_partitions(), self._perform)
        self.ownership.start()
        self.engine.begin()
        self.started.set()
        try:
            while not self._stop.is_set():
                if not self._turn():
                    self._wake.wait(self._idle.seconds())
        finally:
            self._shutdown()

    def _turn(self) -> bool:
        """One turn of the control loop (reading the stream first if nudged since the
        last); whether it did anything."""
        self._wake.clear()
        if self._nudged:
            self._nudged = False
            self.engine.read_soon()
        busy = drive(self.engine.turn(), self._perform)
        self._launch()
        return busy

    def _launch(self) -> None:
        with self._lock:
            free = self.config.concurrency - self._busy
            if self._closed:
                return
            if free <= 0:
                self._launch_flush()
                return
            self._launch_flush()
            for batch in self.engine.start_batches(free):
                self._busy += 1
                self._pool.submit(self._work, batch)

    def _launch_flush(self) -> None:
        """Start a flush of the deferred trims if one is due and none is under way (with
        the lock held)."""
        if self._flushing or self._crashed.is_set() or not self.engine.trims_due():
            return
        self._flushing = True
        self._flusher.submit(self._flush)

    def _flush(self) -> None:
        try:
            drive(self.engine.flush_trims(), self._perform)
        except Abandoned:
            pass  # crashed: the entries stay pending, behind the checkpoint
        except Exception as exc:  # logged; the trims stay pending for the next flush
            log.exception("trim_flush_failed error=%r", exc)
        finally:
            with self._lock:
                self._flushing = False
        self._launch()
        self._wake.set()

    def _work(self, slots: list[RunSlot]) -> None:
        try:
            outcomes = drive(self.engine.run_batch(slots), self._perform)
        except Abandoned:
            outcomes = [RunOutcome.STOPPED] * len(slots)
        except Exception as exc:  # logged; the aggregates are retried, not dropped
            log.exception("dispatch_batch_failed runs=%d error=%r", len(slots), exc)
            outcomes = [RunOutcome.RETRY] * len(slots)
        for slot, outcome in zip(slots, outcomes, strict=True):
            self.engine.finish(slot, outcome)
        with self._lock:
            self._busy -= 1
        self._launch()
        self._wake.set()

    def _perform(self, op: EngineOp) -> Any:
        if isinstance(op, Sleep):
            if self._stop.wait(op.seconds):
                raise Abandoned
            return None
        if isinstance(op, Publish | PublishRound | Write | TrimRound) and self._crashed.is_set():
            raise Abandoned
        if isinstance(op, TrimRound):
            return self.trims.write_all(op.plans)
        return self.ports.perform(op)

    def _shutdown(self) -> None:
        crashed = self._crashed.is_set()
        log.info("dispatcher_stopping name=%s crashed=%s", self.config.name, crashed)
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)
        self._flusher.shutdown(wait=True)
        if not crashed:
            # What the runs published is trimmed before the last checkpoint (a failed
            # flush leaves it pending, and the checkpoint behind it).
            drive(self.engine.flush_trims(), self._perform)
        self.trims.close()
        if not crashed:
            drive(self.engine.checkpoint(time.monotonic(), force=True), self._perform)
        self.ownership.stop(release=not crashed)
        drive(self.engine.shutdown(crashed=True), self._perform)
        log.info(
            "dispatcher_stopped name=%s checkpoint=%s",
            self.config.name,
            describe_position(self.engine.saved),
        )
