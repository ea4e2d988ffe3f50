"""How each operation of the dispatch loop maps onto the ports, sync and async.

:class:`Ports` and :class:`AsyncPorts` bundle what a driver talks to; their ``perform``
carries out one :data:`~docoutbox.dispatch.engine.EngineOp`. Drivers add only their own
concerns (stopping during a sleep, abandoning work after a crash).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from docoutbox.dispatch.engine import (
    CloseStream,
    EngineOp,
    LoadCheckpoint,
    OpenStream,
    PollChanges,
    SaveCheckpoint,
    StartMarker,
)
from docoutbox.dispatch.flow import Publish, Quarantine
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
