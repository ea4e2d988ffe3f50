"""Settled publishers: for a dispatcher in another process than the immediate path
(:mod:`docoutbox.dispatch.extras.immediate`), an entry younger than ``settle`` seconds is
published only once it is that old and still pending.

An entry gone from its document was trimmed, and a trim follows a publish (I3), so it
counts as published. Costs one load per young entry, and ``settle`` seconds of latency on
the safety net (which then only carries what the immediate path failed to do).
``created_at`` comes from the producer's clock: keep ``settle`` well above clock skew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from datetime import datetime
from typing import Any

from docoutbox.dispatch.engine.flow import Publish
from docoutbox.drive import drive, drive_async
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import AsyncPublisher, Publisher, check_publisher
from docoutbox.ports.store import AsyncStoreBackend, StoreBackend
from docoutbox.retry import check_seconds
from docoutbox.store.core import Load, Sleep
from docoutbox.store.document import utcnow

SettleOp = Sleep | Load | Publish


def settled_publish(
    entry: OutboxMessage, settle: float, now: datetime
) -> Generator[SettleOp, Any, bool]:
    """Publish ``entry`` unless, once ``settle`` seconds old, it is gone from its document;
    True if it was published."""
    age = (now - entry.created_at).total_seconds()
    if age < settle:
        yield Sleep(settle - age)
        doc = yield Load(entry.aggregate_id)
        outbox = (doc or {}).get("outbox") or ()
        if not any(isinstance(e, dict) and e.get("id") == entry.id for e in outbox):
            return False
    yield Publish(entry)
    return True


class SettledPublisher:
    """``publisher``, publishing young entries only once settled (see the module)."""

    def __init__(
        self,
        publisher: Publisher,
        backend: StoreBackend,
        settle: float = 0.5,
        *,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        check_publisher(publisher)
        self.publisher = publisher
        self.backend = backend
        self.settle = check_seconds("SettledPublisher.settle", settle)
        self._clock = clock
        self._sleep = sleep
        self.skipped = 0

    def publish(self, entry: OutboxMessage) -> None:
        if not drive(settled_publish(entry, self.settle, self._clock()), self._perform):
            self.skipped += 1

    def _perform(self, op: SettleOp) -> Any:
        if isinstance(op, Sleep):
            return self._sleep(op.seconds)
        if isinstance(op, Load):
            return self.backend.load(op.aggregate_id)
        return self.publisher.publish(op.entry)


class AsyncSettledPublisher:
    """The async twin of :class:`SettledPublisher`, for an
    :class:`~docoutbox.dispatch.drivers.aio.AsyncDispatcher`."""

    def __init__(
        self,
        publisher: AsyncPublisher,
        backend: AsyncStoreBackend,
        settle: float = 0.5,
        *,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        check_publisher(publisher, asynchronous=True)
        self.publisher = publisher
        self.backend = backend
        self.settle = check_seconds("AsyncSettledPublisher.settle", settle)
        self._clock = clock
        self._sleep = sleep
        self.skipped = 0

    async def publish(self, entry: OutboxMessage) -> None:
        flow = settled_publish(entry, self.settle, self._clock())
        if not await drive_async(flow, self._perform):
            self.skipped += 1

    async def _perform(self, op: SettleOp) -> Any:
        if isinstance(op, Sleep):
            return await self._sleep(op.seconds)
        if isinstance(op, Load):
            return await self.backend.load(op.aggregate_id)
        return await self.publisher.publish(op.entry)
