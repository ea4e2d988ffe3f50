"""Claims: in one process, the immediate path and the regular dispatcher publish each
entry once between them (see :mod:`docoutbox.dispatch.extras.immediate`).

Whoever claims an entry first publishes it; the other path waits for the outcome and,
on success, does not publish it again. :func:`claimed_publish` is that rule as a sans-IO
flow, so threads (:meth:`Claims.publish`) and asyncio (:meth:`Claims.publish_async`)
share it; :func:`claimed_round` keeps it per entry for a round of entries published
together (:class:`~docoutbox.ports.dispatch.PipelinedPublisher`), which a guarded
publisher offers exactly when the publisher it guards does.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

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
)

#: How long a path waits at most for another path's claim before publishing anyway.
CLAIM_WAIT = 30.0


@dataclass(frozen=True)
class WaitClaim:
    """Wait up to ``timeout`` seconds for another path's claim to end; True if it did."""

    event: threading.Event
    timeout: float


class Claims:
    """Which entries this process has published, is publishing, or has queued, by ID.

    The immediate path *reserves* a commit's entries when they are offered, so the other
    path waits for it instead of racing it; a reservation ends when the immediate path
    publishes the entry, fails to, or gives it up.

    Bounded: the newest ``size`` published IDs are remembered (an entry older than that
    is long trimmed, or will be published again at worst: at least once still holds).
    Its lock is only held for dictionary updates, so the event loop may call it too.
    """

    def __init__(self, size: int = 100_000) -> None:
        self._size = size
        self._done: OrderedDict[str, None] = OrderedDict()
        self._inflight: dict[str, threading.Event] = {}
        self._reserved: set[str] = set()
        self._lock = threading.Lock()

    def reserve(self, entry_ids: Iterable[str]) -> None:
        with self._lock:
            for entry_id in entry_ids:
                if entry_id not in self._done and entry_id not in self._inflight:
                    self._inflight[entry_id] = threading.Event()
                    self._reserved.add(entry_id)

    def release(self, entry_ids: Iterable[str]) -> None:
        """End the reservations still held on ``entry_ids`` (nothing was published)."""
        for entry_id in entry_ids:
            with self._lock:
                held = entry_id in self._reserved
            if held:
                self.finish(entry_id, False)

    def claim(
        self, entry_id: str, *, reserved: bool = False
    ) -> Literal["mine", "done"] | threading.Event:
        """ "mine": publish it, then :meth:`finish`; "done": already published; an
        Event: another path is publishing it (or has it queued), wait and claim again.
        ``reserved``: the caller is the path that reserved the entry."""
        with self._lock:
            if entry_id in self._done:
                return "done"
            busy = self._inflight.get(entry_id)
            if busy is None:
                self._inflight[entry_id] = threading.Event()
                return "mine"
            if reserved and entry_id in self._reserved:
                self._reserved.discard(entry_id)
                return "mine"
            return busy

    def finish(self, entry_id: str, published: bool) -> None:
        with self._lock:
            event = self._inflight.pop(entry_id, None)
            self._reserved.discard(entry_id)
            if published:
                self._done[entry_id] = None
                while len(self._done) > self._size:
                    self._done.popitem(last=False)
        if event is not None:
            event.set()

    def publish(
        self,
        publisher: Publisher,
        entry: OutboxMessage,
        *,
        reserved: bool = False,
        wait: float = CLAIM_WAIT,
    ) -> bool:
        """Publish ``entry`` unless this process already did; True if *we* published it.

        Raises what the publisher raises. While another path holds the claim, waits for
        it (at most ``wait`` seconds each time, then publishes anyway: at least once).
        """

        def perform(op: Publish | WaitClaim) -> Any:
            if isinstance(op, Publish):
                return publisher.publish(op.entry)
            return op.event.wait(op.timeout)

        return drive(claimed_publish(self, entry, reserved=reserved, wait=wait), perform)

    async def publish_async(
        self,
        publisher: AsyncPublisher,
        entry: OutboxMessage,
        *,
        reserved: bool = False,
        wait: float = CLAIM_WAIT,
    ) -> bool:
        """The async twin of :meth:`publish`: it waits for a claim without blocking the
        event loop (the other path may run on that loop)."""

        async def perform(op: Publish | WaitClaim) -> Any:
            if isinstance(op, Publish):
                return await publisher.publish(op.entry)
            return await asyncio.to_thread(op.event.wait, op.timeout)

        flow = claimed_publish(self, entry, reserved=reserved, wait=wait)
        return await drive_async(flow, perform)


def claimed_publish(
    claims: Claims, entry: OutboxMessage, *, reserved: bool, wait: float
) -> Generator[Publish | WaitClaim, Any, bool]:
    """:meth:`Claims.publish` as a flow: yields the publish, or a wait for another path."""
    while True:
        claim = claims.claim(entry.id, reserved=reserved)
        if claim == "done":
            return False
        if isinstance(claim, threading.Event):
            if (yield WaitClaim(claim, wait)):
                continue
            yield Publish(entry)
            return True
        try:
            yield Publish(entry)
        except BaseException:
            claims.finish(entry.id, False)
            raise
        claims.finish(entry.id, True)
        return True


@dataclass
class Round:
    """What :func:`claimed_round` did: one outcome per entry, in order (None: published,
    by this call or already by the other path), and how many it skipped as published."""

    outcomes: list[Exception | None]
    skipped: int = 0


def claimed_round(
    claims: Claims, entries: Sequence[OutboxMessage], *, wait: float
) -> Generator[PublishRound | Publish | WaitClaim, Any, Round]:
    """:func:`claimed_publish` for each of ``entries``, their publishes in one round.

    An entry already published counts as published (skipped); the entries this call
    claims go out together in one :class:`PublishRound`, and each claim ends with its own
    outcome; an entry another path holds is done after the round, as
    :func:`claimed_publish` does it (wait, then publish): its error becomes its outcome."""
    done = Round([None] * len(entries))
    mine: list[int] = []
    held: list[int] = []
    for index, entry in enumerate(entries):
        claim = claims.claim(entry.id)
        if claim == "done":
            done.skipped += 1
        elif claim == "mine":
            mine.append(index)
        else:
            held.append(index)
    if mine:
        try:
            outcomes = yield PublishRound(tuple(entries[i] for i in mine))
        except BaseException:
            for index in mine:
                claims.finish(entries[index].id, False)
            raise
        for index, outcome in zip(mine, outcomes, strict=True):
            claims.finish(entries[index].id, outcome is None)
            done.outcomes[index] = outcome
    for index in held:
        try:
            published = yield from claimed_publish(
                claims, entries[index], reserved=False, wait=wait
            )
        except Exception as exc:  # noqa: BLE001 - this entry's outcome, reported in order
            done.outcomes[index] = exc
        else:
            if not published:
                done.skipped += 1
    return done


class GuardedPublisher:
    """A publisher that skips entries this process's other path has published already.

    Built around a :class:`~docoutbox.ports.dispatch.PipelinedPublisher`, it is a
    :class:`PipelinedGuardedPublisher`, which has ``publish_many``; around any other
    publisher it has none, so a dispatcher never takes it for one that pipelines."""

    def __new__(cls, publisher: Publisher, claims: Claims) -> GuardedPublisher:
        pipelined = cls is GuardedPublisher and isinstance(publisher, PipelinedPublisher)
        return object.__new__(PipelinedGuardedPublisher if pipelined else cls)

    def __init__(self, publisher: Publisher, claims: Claims) -> None:
        self.publisher = publisher
        self.claims = claims
        self.skipped = 0

    def publish(self, entry: OutboxMessage) -> None:
        if not self.claims.publish(self.publisher, entry):
            self.skipped += 1


class PipelinedGuardedPublisher(GuardedPublisher):
    """A :class:`GuardedPublisher` around a publisher with ``publish_many``."""

    publisher: PipelinedPublisher

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """Each entry guarded as :meth:`publish` guards it; those to send in one round."""

        def perform(op: PublishRound | Publish | WaitClaim) -> Any:
            if isinstance(op, PublishRound):
                replies = self.publisher.publish_many(op.entries)
                return checked_outcomes(replies, len(op.entries))
            if isinstance(op, Publish):
                return self.publisher.publish(op.entry)
            return op.event.wait(op.timeout)

        done = drive(claimed_round(self.claims, entries, wait=CLAIM_WAIT), perform)
        self.skipped += done.skipped
        return done.outcomes


class AsyncGuardedPublisher:
    """The async twin of :class:`GuardedPublisher`, for an
    :class:`~docoutbox.dispatch.drivers.aio.AsyncDispatcher` (an
    :class:`AsyncPipelinedGuardedPublisher` around a publisher with ``publish_many``)."""

    def __new__(cls, publisher: AsyncPublisher, claims: Claims) -> AsyncGuardedPublisher:
        pipelined = cls is AsyncGuardedPublisher and isinstance(publisher, AsyncPipelinedPublisher)
        return object.__new__(AsyncPipelinedGuardedPublisher if pipelined else cls)

    def __init__(self, publisher: AsyncPublisher, claims: Claims) -> None:
        self.publisher = publisher
        self.claims = claims
        self.skipped = 0

    async def publish(self, entry: OutboxMessage) -> None:
        if not await self.claims.publish_async(self.publisher, entry):
            self.skipped += 1


class AsyncPipelinedGuardedPublisher(AsyncGuardedPublisher):
    """An :class:`AsyncGuardedPublisher` around a publisher with ``publish_many``."""

    publisher: AsyncPipelinedPublisher

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The async twin of :meth:`PipelinedGuardedPublisher.publish_many`."""

        async def perform(op: PublishRound | Publish | WaitClaim) -> Any:
            if isinstance(op, PublishRound):
                replies = await self.publisher.publish_many(op.entries)
                return checked_outcomes(replies, len(op.entries))
            if isinstance(op, Publish):
                return await self.publisher.publish(op.entry)
            return await asyncio.to_thread(op.event.wait, op.timeout)

        done = await drive_async(claimed_round(self.claims, entries, wait=CLAIM_WAIT), perform)
        self.skipped += done.skipped
        return done.outcomes
