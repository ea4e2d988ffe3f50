"""The asyncio dispatcher: the same engine as :class:`~docoutbox.Dispatcher`.

A thin driver of :class:`~docoutbox.dispatch.engine.loop.DispatchEngine` on an event loop: the
control loop runs in :meth:`AsyncDispatcher.run`, batches of aggregate runs in tasks (at
most ``concurrency`` at once, serial per aggregate). Its ports are async
(:class:`~docoutbox.ports.store.AsyncStoreBackend`,
:class:`~docoutbox.ports.dispatch.AsyncPublisher`,
:class:`~docoutbox.ports.dispatch.AsyncDeadLetters`,
:class:`~docoutbox.ports.dispatch.AsyncChangeSource`,
:class:`~docoutbox.ports.dispatch.AsyncCheckpoints`); :func:`in_thread` turns a sync port
into an async one where a driver has no async API.

Leases stay with the :class:`~docoutbox.dispatch.drivers.ownership.LeaseKeeper`, whose heartbeat
runs on its own thread against a sync :class:`~docoutbox.ports.dispatch.LeaseTable`:
renewing must not depend on how busy the event loop is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from docoutbox.dispatch.drivers.operations import (
    AsyncGroupWriter,
    AsyncPorts,
    IdleWait,
    wall_clock_engine,
)
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.checkpoint import describe_position
from docoutbox.dispatch.engine.flow import Publish
from docoutbox.dispatch.engine.loop import DispatcherConfig, EngineOp, PublishRound, TrimRound
from docoutbox.dispatch.engine.metrics import Metrics
from docoutbox.dispatch.engine.scheduler import RunOutcome, RunSlot
from docoutbox.drive import Abandoned, drive_async
from docoutbox.ports.dispatch import (
    AsyncChangeSource,
    AsyncCheckpoints,
    AsyncDeadLetters,
    AsyncPublisher,
    Ownership,
)
from docoutbox.ports.payloads import AsyncPayloadStore
from docoutbox.ports.store import AsyncStoreBackend
from docoutbox.store.core import Sleep, Write

log = logging.getLogger("docoutbox.dispatcher")


class InThread:
    """Any sync port as its async twin: each method call runs in a worker thread, but for
    the pure functions of :data:`PURE`, called as they are."""

    #: Methods that do no I/O: a change source's ``merge_positions`` (see
    #: :class:`~docoutbox.ports.dispatch.ChangeEvent`).
    PURE = frozenset({"merge_positions"})

    def __init__(self, port: Any) -> None:
        self._port = port

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._port, name)
        if name in self.PURE:
            return cast(Callable[..., Any], method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


def in_thread(port: Any) -> Any:
    """``port`` (a sync :class:`ChangeSource`, :class:`Checkpoints`, :class:`DeadLetters`,
    :class:`Publisher` or store backend) as an async one, calling it in a thread."""
    return InThread(port)


class AsyncDispatcher:
    def __init__(
        self,
        backend: AsyncStoreBackend,
        publisher: AsyncPublisher,
        dead_letters: AsyncDeadLetters,
        *,
        source: AsyncChangeSource | None = None,
        checkpoints: AsyncCheckpoints | None = None,
        ownership: Ownership | None = None,
        config: DispatcherConfig | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
        payloads: AsyncPayloadStore | None = None,
    ) -> None:
        self.engine = wall_clock_engine(
            config, ownership, source, checkpoints is not None, rng, metrics
        )
        self.config, self.ownership = self.engine.config, self.engine.ownership
        self.metrics = self.engine.metrics
        self.backend = backend
        self.source = source
        self.checkpoints = checkpoints
        self.ports = AsyncPorts(backend, publisher, dead_letters, source, checkpoints, payloads)
        self.engine.rounds = self.ports.pipelined
        self.engine.due_scans = self.ports.due
        #: Trims of concurrent runs go out together.
        self.trims = AsyncGroupWriter(backend, direct_workers=self.config.concurrency)
        self._stopping = False
        self._crashed = False
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: The flush of the deferred trims under way, if any (one at a time).
        self._flush_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        #: How long an idle loop sleeps (until its next timed work).
        self._idle = IdleWait(self.engine, self._wake_soon)
        #: Set once the first leases are taken and the loop is about to start.
        self.started = threading.Event()

    def queued(self) -> int:
        """Aggregates this instance has in hand (its work queue, not the outbox backlog)."""
        return self.engine.queue.backlog()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def stream_open(self) -> bool | None:
        """Whether the change stream is open (None without a change source)."""
        return self.engine.stream_open

    def stop(self) -> None:
        """Stop taking work; :meth:`run` finishes in-flight work, checkpoints and returns.

        Safe to call from any thread (say, a signal handler's).
        """
        self._stopping = True
        self._signal()

    def halt(self) -> None:
        """Stop as abruptly as a crash: abandon work, no checkpoint, keep the leases."""
        self._crashed = True
        self.stop()

    def nudge(self) -> None:
        """Read the change stream now, and start its waits over
        (:meth:`~docoutbox.dispatch.engine.loop.DispatchEngine.read_soon`): entries were
        just committed. A store's commit listener, say; safe to call from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not running yet: its first turn reads the stream anyway
        loop.call_soon_threadsafe(self._read_soon)

    def _read_soon(self) -> None:
        self.engine.read_soon()
        self._wake.set()

    def _wake_soon(self) -> None:
        """Take a turn now (the ownership gained scopes); safe to call from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not running yet: its first turn takes them
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no turn to take
            loop.call_soon_threadsafe(self._wake.set)

    def _signal(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not running yet: run() sees the flag
        loop.call_soon_threadsafe(self._stop.set)
        loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        if self._stopping:
            self._stop.set()
        log.info(
            "dispatcher_started name=%s partitions=%d concurrency=%d stream=%s async=True",
            cfg.name,
            cfg.partitions,
            cfg.concurrency,
            self.source is not None,
        )
        if not isinstance(self.ownership, SoleOwner):
            await drive_async(self.engine.check_partitions(), self._perform)
        await asyncio.to_thread(self.ownership.start)
        self.engine.begin()
        self.started.set()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                busy = await drive_async(self.engine.turn(), self._perform)
                self._launch()
                if not busy:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self._idle.seconds())
        finally:
            await self._shutdown()

    def _launch(self) -> None:
        if self._closed:
            return
        self._launch_flush()
        free = self.config.concurrency - len(self._tasks)
        if free <= 0:
            return
        for batch in self.engine.start_batches(free):
            task = asyncio.create_task(self._work(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _launch_flush(self) -> None:
        """Start a flush of the deferred trims if one is due and none is under way."""
        if self._flush_task is not None or self._crashed or not self.engine.trims_due():
            return
        self._flush_task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            await drive_async(self.engine.flush_trims(), self._perform)
        except Abandoned:
            pass  # crashed: the entries stay pending, behind the checkpoint
        except Exception as exc:  # logged; the trims stay pending for the next flush
            log.exception("trim_flush_failed error=%r", exc)
        finally:
            self._flush_task = None
        self._launch()
        self._wake.set()

    async def _work(self, slots: list[RunSlot]) -> None:
        try:
            outcomes = await drive_async(self.engine.run_batch(slots), self._perform)
        except Abandoned:
            outcomes = [RunOutcome.STOPPED] * len(slots)
        except Exception as exc:  # logged; the aggregates are retried, not dropped
            log.exception("dispatch_batch_failed runs=%d error=%r", len(slots), exc)
            outcomes = [RunOutcome.RETRY] * len(slots)
        for slot, outcome in zip(slots, outcomes, strict=True):
            self.engine.finish(slot, outcome)
        self._tasks.discard(asyncio.current_task())
        self._launch()
        self._wake.set()

    async def _perform(self, op: EngineOp) -> Any:
        if isinstance(op, Sleep):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), op.seconds)
            if self._stop.is_set():
                raise Abandoned
            return None
        if isinstance(op, Publish | PublishRound | Write | TrimRound) and self._crashed:
            raise Abandoned
        if isinstance(op, TrimRound):
            return await self.trims.write_all(op.plans)
        return await self.ports.perform(op)

    async def _shutdown(self) -> None:
        crashed = self._crashed
        log.info("dispatcher_stopping name=%s crashed=%s", self.config.name, crashed)
        self._closed = True
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._flush_task is not None:
            await asyncio.gather(self._flush_task, return_exceptions=True)
        if not crashed:
            # What the runs published is trimmed before the last checkpoint (a failed
            # flush leaves it pending, and the checkpoint behind it).
            await drive_async(self.engine.flush_trims(), self._perform)
            await drive_async(self.engine.checkpoint(time.monotonic(), force=True), self._perform)
        await asyncio.to_thread(self.ownership.stop, release=not crashed)
        await drive_async(self.engine.shutdown(crashed=True), self._perform)
        log.info(
            "dispatcher_stopped name=%s checkpoint=%s",
            self.config.name,
            describe_position(self.engine.saved),
        )
