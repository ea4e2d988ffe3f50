"""Settled publishers: for a dispatcher in another process than the immediate path
(:mod:`docoutbox.dispatch.extras.immediate`), an entry younger than ``settle`` seconds is
published only once it is that old and still pending.

An entry gone from its document was trimmed, and a trim follows a publish (I3), so it
counts as published. Costs one load per young entry, and ``settle`` seconds of latency on
the safety net (which then only carries what the immediate path failed to do).
``created_at`` comes from the producer's clock: keep ``settle`` well above clock skew.

A settled publisher offers ``publish_many`` exactly when the publisher it wraps does
(:class:`~docoutbox.ports.dispatch.PipelinedPublisher`, checked once when a dispatcher is
built): :func:`settled_round` waits once for the youngest entry of a round to settle,
looks up each young one, and sends the rest together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from docoutbox.dispatch.drivers.operations import checked_outcomes
from docoutbox.dispatch.engine.flow import Publish
from docoutbox.dispatch.engine.loop import PublishRound
from docoutbox.drive import drive, drive_async
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import (
    AsyncPipelinedPublisher,
    AsyncPublisher,
    PipelinedPublisher,
    Publisher,
    check_publisher,
)
from docoutbox.ports.store import AsyncStoreBackend, StoreBackend
from docoutbox.retry import check_seconds
from docoutbox.store.core import Load, Sleep
from docoutbox.store.document import utcnow

SettleOp = Sleep | Load | Publish | PublishRound


def settled_publish(
    entry: OutboxMessage, settle: float, now: datetime
) -> Generator[SettleOp, Any, bool]:
    """Publish ``entry`` unless, once ``settle`` seconds old, it is gone from its document;
    True if it was published."""
    age = (now - entry.created_at).total_seconds()
    if age < settle:
        yield Sleep(settle - age)
        if not (yield from _pending(entry)):
            return False
    yield Publish(entry)
    return True


@dataclass
class Round:
    """What :func:`settled_round` did: one outcome per entry, in order (None: published,
    or gone from its document once settled), and how many it skipped as gone."""

    outcomes: list[Exception | None]
    skipped: int = 0


def settled_round(
    entries: Sequence[OutboxMessage], settle: float, now: datetime
) -> Generator[SettleOp, Any, Round]:
    """:func:`settled_publish` for each of ``entries``, their publishes in one round: one
    wait, until the youngest is ``settle`` seconds old, then a look at each young entry's
    document; the entries still pending, and the old ones, go out together."""
    done = Round([None] * len(entries))
    young = [(now - e.created_at).total_seconds() < settle for e in entries]
    if any(young):
        yield Sleep(max(settle - (now - e.created_at).total_seconds() for e in entries))
    send: list[int] = []
    for index, entry in enumerate(entries):
        if young[index] and not (yield from _pending(entry)):
            done.skipped += 1
        else:
            send.append(index)
    if send:
        outcomes = yield PublishRound(tuple(entries[i] for i in send))
        for index, outcome in zip(send, outcomes, strict=True):
            done.outcomes[index] = outcome
    return done


def _pending(entry: OutboxMessage) -> Generator[SettleOp, Any, bool]:
    """Whether ``entry`` is still in its document's outbox (gone: trimmed, so published)."""
    doc = yield Load(entry.aggregate_id)
    outbox = (doc or {}).get("outbox") or ()
    return any(isinstance(e, dict) and e.get("id") == entry.id for e in outbox)


class SettledPublisher:
    """``publisher``, publishing young entries only once settled (see the module): a
    :class:`PipelinedSettledPublisher`, with ``publish_many``, around a publisher that has
    one."""

    def __new__(cls, publisher: Publisher, *args: Any, **options: Any) -> SettledPublisher:
        pipelined = cls is SettledPublisher and isinstance(publisher, PipelinedPublisher)
        return object.__new__(PipelinedSettledPublisher if pipelined else cls)

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
        if isinstance(op, PublishRound):
            assert isinstance(self.publisher, PipelinedPublisher)
            return checked_outcomes(self.publisher.publish_many(op.entries), len(op.entries))
        return self.publisher.publish(op.entry)


class PipelinedSettledPublisher(SettledPublisher):
    """A :class:`SettledPublisher` around a publisher with ``publish_many``."""

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """Each entry settled as :meth:`publish` settles it; those to send in one round."""
        done = drive(settled_round(entries, self.settle, self._clock()), self._perform)
        self.skipped += done.skipped
        return done.outcomes


class AsyncSettledPublisher:
    """The async twin of :class:`SettledPublisher`, for an
    :class:`~docoutbox.dispatch.drivers.aio.AsyncDispatcher` (an
    :class:`AsyncPipelinedSettledPublisher` around a publisher with ``publish_many``)."""

    def __new__(
        cls, publisher: AsyncPublisher, *args: Any, **options: Any
    ) -> AsyncSettledPublisher:
        pipelined = cls is AsyncSettledPublisher and isinstance(publisher, AsyncPipelinedPublisher)
        return object.__new__(AsyncPipelinedSettledPublisher if pipelined else cls)

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
        if isinstance(op, PublishRound):
            assert isinstance(self.publisher, AsyncPipelinedPublisher)
            replies = await self.publisher.publish_many(op.entries)
            return checked_outcomes(replies, len(op.entries))
        return await self.publisher.publish(op.entry)


class AsyncPipelinedSettledPublisher(AsyncSettledPublisher):
    """An :class:`AsyncSettledPublisher` around a publisher with ``publish_many``."""

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The async twin of :meth:`PipelinedSettledPublisher.publish_many`."""
        flow = settled_round(entries, self.settle, self._clock())
        done = await drive_async(flow, self._perform)
        self.skipped += done.skipped
        return done.outcomes
