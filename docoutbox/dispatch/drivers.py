"""How each operation of the dispatch loop maps onto the ports, sync and async; and the
group commit that writes the trims of concurrent runs in one round trip.

:class:`Ports` and :class:`AsyncPorts` bundle what a driver talks to; their ``perform``
carries out one :data:`~docoutbox.dispatch.engine.EngineOp`. Drivers add only their own
concerns (stopping during a sleep, abandoning work after a crash).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from docoutbox.dispatch.engine import (
    CloseStream,
    DispatchEngine,
    DispatcherConfig,
    EngineOp,
    LoadCheckpoint,
    OpenStream,
    PollChanges,
    SaveCheckpoint,
    StartMarker,
)
from docoutbox.dispatch.flow import Publish, Quarantine
from docoutbox.dispatch.metrics import Metrics
from docoutbox.dispatch.ownership import Ownership
from docoutbox.dispatch.ports import (
    AsyncChangeSource,
    AsyncCheckpoints,
    AsyncDeadLetters,
    AsyncPublisher,
    ChangeSource,
    Checkpoints,
    DeadLetters,
    Publisher,
)
from docoutbox.store.core import FindPending, Load, Write
from docoutbox.store.document import utcnow
from docoutbox.store.plans import WritePlan
from docoutbox.store.ports import AsyncStoreBackend, StoreBackend


@dataclass
class Ports:
    backend: StoreBackend
    publisher: Publisher
    dead_letters: DeadLetters
    source: ChangeSource | None = None
    checkpoints: Checkpoints | None = None

    def perform(self, op: EngineOp) -> Any:
        """Carry out ``op`` (a :class:`Sleep` is the driver's: it is not handled here)."""
        if isinstance(op, Publish):
            return self.publisher.publish(op.entry)
        if isinstance(op, Write):
            return self.backend.write(op.plan)
        if isinstance(op, Load):
            return self.backend.load(op.aggregate_id)
        if isinstance(op, FindPending):
            return self.backend.find_pending(
                after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
            )
        if isinstance(op, Quarantine):
            return self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
        if isinstance(op, PollChanges | OpenStream | StartMarker | CloseStream):
            assert self.source is not None, "a stream operation without a change source"
            if isinstance(op, PollChanges):
                return self.source.poll(op.max_events)
            if isinstance(op, OpenStream):
                return self.source.open(op.position)
            if isinstance(op, StartMarker):
                return self.source.start_marker()
            return self.source.close()
        if isinstance(op, LoadCheckpoint | SaveCheckpoint):
            assert self.checkpoints is not None, "a checkpoint operation without checkpoints"
            if isinstance(op, LoadCheckpoint):
                return self.checkpoints.load(op.name)
            return self.checkpoints.save(op.name, op.position)
        raise TypeError(f"not a dispatch operation: {op!r}")


@dataclass
class AsyncPorts:
    backend: AsyncStoreBackend
    publisher: AsyncPublisher
    dead_letters: AsyncDeadLetters
    source: AsyncChangeSource | None = None
    checkpoints: AsyncCheckpoints | None = None

    async def perform(self, op: EngineOp) -> Any:
        """The async twin of :meth:`Ports.perform`."""
        if isinstance(op, Publish):
            return await self.publisher.publish(op.entry)
        if isinstance(op, Write):
            return await self.backend.write(op.plan)
        if isinstance(op, Load):
            return await self.backend.load(op.aggregate_id)
        if isinstance(op, FindPending):
            return await self.backend.find_pending(
                after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
            )
        if isinstance(op, Quarantine):
            return await self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
        if isinstance(op, PollChanges | OpenStream | StartMarker | CloseStream):
            assert self.source is not None, "a stream operation without a change source"
            if isinstance(op, PollChanges):
                return await self.source.poll(op.max_events)
            if isinstance(op, OpenStream):
                return await self.source.open(op.position)
            if isinstance(op, StartMarker):
                return await self.source.start_marker()
            return await self.source.close()
        if isinstance(op, LoadCheckpoint | SaveCheckpoint):
            assert self.checkpoints is not None, "a checkpoint operation without checkpoints"
            if isinstance(op, LoadCheckpoint):
                return await self.checkpoints.load(op.name)
            return await self.checkpoints.save(op.name, op.position)
        raise TypeError(f"not a dispatch operation: {op!r}")


def write_many(backend: Any, plans: Sequence[WritePlan]) -> list[bool]:
    """``backend.write_many(plans)`` where the backend has it (one round trip), else one
    :meth:`~docoutbox.store.ports.StoreBackend.write` per plan."""
    many = getattr(backend, "write_many", None)
    if callable(many):
        results: list[bool] = many(plans)
        return results
    return [backend.write(plan) for plan in plans]


async def write_many_async(backend: Any, plans: Sequence[WritePlan]) -> list[bool]:
    """The async twin of :func:`write_many`."""
    many = getattr(backend, "write_many", None)
    if callable(many):
        results: list[bool] = await many(plans)
        return results
    return [await backend.write(plan) for plan in plans]


def _groups(backend: Any) -> bool:
    """Whether ``backend`` writes several plans in one round trip (``write_many``).

    Without it, grouping would only queue each run's trim behind the others': each run
    writes its own, concurrently (Cosmos DB has no multi-item write across partitions).
    """
    return callable(getattr(backend, "write_many", None))


class GroupWriter:
    """Trims of concurrent runs, written together: a group commit.

    The first caller writes everything queued in one :func:`write_many`; callers arriving
    meanwhile queue up and are written by the next round, in one round trip for all. A
    backend without ``write_many`` is written to directly, concurrently.
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._direct = not _groups(backend)
        self._queue: list[tuple[WritePlan, Future[bool]]] = []
        self._writing = False
        self._lock = threading.Lock()
        #: Round trips made, and plans written: ``plans / batches`` is the batching gain.
        self.batches = 0
        self.plans = 0

    def write(self, plan: WritePlan) -> bool:
        if self._direct:
            return bool(self._backend.write(plan))
        future: Future[bool] = Future()
        with self._lock:
            self._queue.append((plan, future))
            lead = not self._writing
            self._writing = True
        if lead:
            self._flush()
        return future.result()

    def _flush(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._writing = False
                    return
            self.batches += 1
            self.plans += len(batch)
            try:
                results = write_many(self._backend, [plan for plan, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every writer of the batch sees it
                for _, future in batch:
                    future.set_exception(exc)
            else:
                for (_, future), ok in zip(batch, results, strict=True):
                    future.set_result(ok)


class AsyncGroupWriter:
    """The asyncio twin of :class:`GroupWriter`."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._direct = not _groups(backend)
        self._queue: list[tuple[WritePlan, asyncio.Future[bool]]] = []
        self._writing = False
        self.batches = 0
        self.plans = 0

    async def write(self, plan: WritePlan) -> bool:
        if self._direct:
            return bool(await self._backend.write(plan))
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((plan, future))
        if not self._writing:
            self._writing = True
            try:
                await self._flush()
            finally:
                self._writing = False
        return await future

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            self.batches += 1
            self.plans += len(batch)
            try:
                results = await write_many_async(self._backend, [plan for plan, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every writer of the batch sees it
                for _, future in batch:
                    future.set_exception(exc)
            else:
                for (_, future), ok in zip(batch, results, strict=True):
                    future.set_result(ok)


def wall_clock_engine(
    config: DispatcherConfig,
    ownership: Ownership,
    stream: bool,
    checkpoints: bool,
    rng: random.Random | None,
    metrics: Metrics | None,
) -> DispatchEngine:
    """The engine as the threaded and asyncio drivers run it: on the wall clock."""
    return DispatchEngine(
        config,
        ownership,
        stream=stream,
        checkpoints=checkpoints,
        monotonic=time.monotonic,
        clock=utcnow,
        rng=rng or random.Random(),
        metrics=metrics,
    )
