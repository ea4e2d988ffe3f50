"""Group commit: concurrent ``handle`` calls on one aggregate, in one process, share writes.

Rule: per aggregate, at most one caller (the *leader*) talks to the database at a time.
Callers that arrive meanwhile queue up; when the leader's write is done, it hands every
queued caller's message to the next leader, who handles them all as one batch
(:mod:`docoutbox.store.batch`): one conditional write instead of one racing write each.
Each caller still gets its own outcome, or its own handler's error.

Without it, N writers of one hot document each load, decide and write, and all but one
lose the optimistic race and retry; with it, they take turns in batches and never race
each other (writers in *other* processes still race, and lose or win as before).

:class:`Coalescer` is the pure bookkeeping; :func:`handle_sync` and :func:`handle_async`
wait on it with a thread future or an asyncio future.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from docoutbox.model import AggregateId, check_aggregate_id
from docoutbox.store.batch import BatchOutcome, Failed, Item
from docoutbox.store.core import Outcome

S = TypeVar("S", bound=BaseModel)
W = TypeVar("W")

#: What a waiting caller receives when it becomes the leader instead of a result.
LEAD = object()


@dataclass
class Request(Generic[S, W]):
    item: Item[S]
    waiter: W


@dataclass
class _Queue(Generic[S, W]):
    waiting: deque[Request[S, W]] = field(default_factory=deque)
    busy: bool = False


class Coalescer(Generic[S, W]):
    """Who leads, and which requests a leader takes. Thread-safe; no waiting in here."""

    def __init__(self, max_batch: int = 256) -> None:
        self.max_batch = max_batch
        self._queues: dict[AggregateId, _Queue[S, W]] = {}
        self._lock = threading.Lock()

    def submit(self, aggregate_id: AggregateId, request: Request[S, W]) -> bool:
        """Queue ``request``; True when its caller must lead now."""
        with self._lock:
            queue = self._queues.setdefault(aggregate_id, _Queue())
            queue.waiting.append(request)
            if queue.busy:
                return False
            queue.busy = True
            return True

    def take(self, aggregate_id: AggregateId) -> list[Request[S, W]]:
        """The leader's batch: the oldest queued requests, up to ``max_batch``."""
        with self._lock:
            waiting = self._queues[aggregate_id].waiting
            return [waiting.popleft() for _ in range(min(len(waiting), self.max_batch))]

    def requeue(self, aggregate_id: AggregateId, requests: Sequence[Request[S, W]]) -> None:
        """Put a batch back at the head of the queue (its leader was interrupted)."""
        with self._lock:
            self._queues[aggregate_id].waiting.extendleft(reversed(requests))

    def finish(
        self, aggregate_id: AggregateId, gone: Callable[[Request[S, W]], bool] | None = None
    ) -> Request[S, W] | None:
        """End a leader's turn: the queued request whose caller leads next, if any.

        Requests for which ``gone`` is true (their caller was cancelled while queued) are
        dropped first: nothing of them was written.
        """
        with self._lock:
            queue = self._queues[aggregate_id]
            while queue.waiting and gone is not None and gone(queue.waiting[0]):
                queue.waiting.popleft()
            if queue.waiting:
                return queue.waiting[0]
            del self._queues[aggregate_id]
            return None


def _unwrap(result: Outcome[S] | Failed) -> Outcome[S]:
    if isinstance(result, Failed):
        raise result.error
    return result


RunBatch = Callable[[AggregateId, Sequence[Item[S]]], BatchOutcome[S]]
RunBatchAsync = Callable[[AggregateId, Sequence[Item[S]]], Awaitable[BatchOutcome[S]]]


def handle_sync(
    coalescer: Coalescer[S, Future[Any]],
    run: RunBatch[S],
    aggregate_id: AggregateId,
    item: Item[S],
) -> Outcome[S]:
    """Handle ``item`` in a group commit, on the calling thread or the leader's."""
    check_aggregate_id(aggregate_id)
    request: Request[S, Future[Any]] = Request(item, Future())
    if not coalescer.submit(aggregate_id, request):
        result = request.waiter.result()
        if result is not LEAD:
            return _unwrap(result)
    mine: Any = LEAD
    while mine is LEAD:
        batch = coalescer.take(aggregate_id)
        try:
            outcome = run(aggregate_id, [r.item for r in batch])
        except BaseException:
            # Interrupted: the others' messages are handled again by the next leader (the
            # inbox absorbs whatever this write may have applied).
            coalescer.requeue(aggregate_id, [r for r in batch if r is not request])
            _hand_over(coalescer, aggregate_id)
            raise
        for r, res in zip(batch, outcome.results, strict=True):
            if r is request:
                mine = res
            else:
                r.waiter.set_result(res)
        if mine is LEAD:  # max_batch reached before our own request: lead again
            continue
        _hand_over(coalescer, aggregate_id)
    return _unwrap(mine)


def _hand_over(coalescer: Coalescer[S, Future[Any]], aggregate_id: AggregateId) -> None:
    following = coalescer.finish(aggregate_id)
    if following is not None:
        following.waiter.set_result(LEAD)


async def handle_async(
    coalescer: Coalescer[S, asyncio.Future[Any]],
    run: RunBatchAsync[S],
    aggregate_id: AggregateId,
    item: Item[S],
) -> Outcome[S]:
    """The asyncio twin of :func:`handle_sync`: the leader is one of the waiting tasks."""
    check_aggregate_id(aggregate_id)
    request: Request[S, asyncio.Future[Any]] = Request(
        item, asyncio.get_running_loop().create_future()
    )
    if not coalescer.submit(aggregate_id, request):
        try:
            result = await request.waiter
        except asyncio.CancelledError:
            waiter = request.waiter
            if waiter.done() and not waiter.cancelled() and waiter.result() is LEAD:
                _hand_over_async(coalescer, aggregate_id)
            raise
        if result is not LEAD:
            return _unwrap(result)
    mine: Any = LEAD
    while mine is LEAD:
        batch = [r for r in coalescer.take(aggregate_id) if r is request or not r.waiter.done()]
        try:
            outcome = await run(aggregate_id, [r.item for r in batch])
        except BaseException:
            coalescer.requeue(aggregate_id, [r for r in batch if r is not request])
            _hand_over_async(coalescer, aggregate_id)
            raise
        for r, res in zip(batch, outcome.results, strict=True):
            if r is request:
                mine = res
            elif not r.waiter.done():
                r.waiter.set_result(res)
        if mine is LEAD:
            continue
        _hand_over_async(coalescer, aggregate_id)
    return _unwrap(mine)


def _hand_over_async(
    coalescer: Coalescer[S, asyncio.Future[Any]], aggregate_id: AggregateId
) -> None:
    following = coalescer.finish(aggregate_id, lambda r: r.waiter.done())
    if following is not None:
        following.waiter.set_result(LEAD)
