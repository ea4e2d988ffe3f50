"""The public stores: thin sync and async drivers over the flows in :mod:`docoutbox.store.core`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Sequence
from concurrent.futures import Future
from datetime import datetime
from functools import partial
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from docoutbox.drive import drive, drive_async
from docoutbox.errors import NotFound
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
from docoutbox.store.batch import BatchCore, BatchOutcome, Item
from docoutbox.store.core import (
    Core,
    Created,
    FindPending,
    Flow,
    Load,
    Op,
    Outcome,
    StoreConfig,
    Write,
)
from docoutbox.store.document import Snapshot
from docoutbox.store.group import Coalescer, handle_async, handle_sync
from docoutbox.store.ports import AsyncStoreBackend, StoreBackend

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")


def run_sync(flow: Flow[T], backend: StoreBackend, sleep: Callable[[float], None]) -> T:
    """Drive ``flow`` against a sync backend."""
    return drive(flow, partial(_perform, backend=backend, sleep=sleep))


def _perform(op: Op, backend: StoreBackend, sleep: Callable[[float], None]) -> Any:
    if isinstance(op, Load):
        return backend.load(op.aggregate_id)
    if isinstance(op, Write):
        return backend.write(op.plan)
    if isinstance(op, FindPending):
        return backend.find_pending(
            after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
        )
    sleep(op.seconds)
    return None


async def run_async(
    flow: Flow[T], backend: AsyncStoreBackend, sleep: Callable[[float], Awaitable[None]]
) -> T:
    """Drive ``flow`` against an async backend."""
    return await drive_async(flow, partial(_perform_async, backend=backend, sleep=sleep))


async def _perform_async(
    op: Op, backend: AsyncStoreBackend, sleep: Callable[[float], Awaitable[None]]
) -> Any:
    if isinstance(op, Load):
        return await backend.load(op.aggregate_id)
    if isinstance(op, Write):
        return await backend.write(op.plan)
    if isinstance(op, FindPending):
        return await backend.find_pending(
            after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
        )
    await sleep(op.seconds)
    return None


class AggregateStore(Generic[S]):
    """Aggregates of one type in one collection, used synchronously and thread-safely.

    >>> store = AggregateStore(MongoBackend(db.accounts), Account)
    >>> outcome = store.handle("acc-1", message, handlers)
    """

    def __init__(
        self,
        backend: StoreBackend,
        model: type[S],
        config: StoreConfig | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        group_commit: bool = False,
    ) -> None:
        self.backend = backend
        self._core = Core(
            model, config or StoreConfig(), backend.document_size, backend.max_document_bytes
        )
        self._sleep = sleep
        self._batch = BatchCore(self._core, backend.document_size, backend.max_document_bytes)
        self._group: Coalescer[S, Future[Any]] | None = Coalescer() if group_commit else None
        #: Called with every outcome that committed new outbox entries (immediate dispatch).
        self.commit_listeners: list[Callable[[Outcome[S]], None]] = []

    @property
    def config(self) -> StoreConfig:
        return self._core.config

    def _run(self, flow: Flow[T]) -> T:
        return run_sync(flow, self.backend, self._sleep)

    def handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        *,
        create: bool = False,
    ) -> Outcome[S]:
        """Handle ``message`` exactly once on the aggregate (see :class:`Outcome`).

        With ``create=True`` a missing aggregate starts from the model's defaults. With
        ``group_commit=True``, concurrent calls for one aggregate share writes
        (:mod:`docoutbox.store.group`).
        """
        observer = self.config.observer
        if observer is None:
            return self._handle(aggregate_id, message, handler, create)
        msg = Message.parse(message)
        with observer.handling(self._core.aggregate_type, aggregate_id, msg):
            return self._handle(aggregate_id, msg, handler, create)

    def _handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        create: bool,
    ) -> Outcome[S]:
        if self._group is not None:
            item = Item(Message.parse(message), handler, create)
            outcome = handle_sync(self._group, self._run_batch, aggregate_id, item)
        else:
            outcome = self._run(self._core.handle(aggregate_id, message, handler, create=create))
        _notify(self.commit_listeners, (outcome,))
        return outcome

    def handle_batch(
        self,
        aggregate_id: AggregateId,
        messages: Sequence[Message | dict[str, Any]],
        handler: Handler[S],
        *,
        create: bool = False,
    ) -> BatchOutcome[S]:
        """Handle ``messages`` in order on one aggregate, in as few writes as possible.

        One result per message (see :mod:`docoutbox.store.batch`); a failing handler
        gets its error in its result, and the other messages still commit.
        """
        items = [Item(Message.parse(m), handler, create) for m in messages]
        outcome = self._run_batch(aggregate_id, items)
        _notify(self.commit_listeners, outcome.results)
        return outcome

    def _run_batch(self, aggregate_id: AggregateId, items: Sequence[Item[S]]) -> BatchOutcome[S]:
        return self._run(self._batch.handle_batch(aggregate_id, items))

    def create(self, aggregate_id: AggregateId, state: S) -> Created[S]:
        """Create the aggregate unless it exists; either way return what is stored."""
        return self._run(self._core.create(aggregate_id, state))

    def load(self, aggregate_id: AggregateId) -> Snapshot[S] | None:
        return self._run(self._core.load(aggregate_id))

    def get(self, aggregate_id: AggregateId) -> Snapshot[S]:
        snapshot = self.load(aggregate_id)
        if snapshot is None:
            raise NotFound(f"{self._core.aggregate_type} {aggregate_id!r} does not exist")
        return snapshot

    def trim(self, aggregate_id: AggregateId, entry_ids: Collection[str]) -> bool:
        """Remove published entries; never changes ``version``. False if no such aggregate."""
        return self._run(self._core.trim(aggregate_id, entry_ids))

    def record_failure(
        self, aggregate_id: AggregateId, entry_id: str, attempts: int, error: str
    ) -> bool:
        """Store a failed publish on a pending entry; never changes ``version``.

        False when the entry is no longer pending.
        """
        return self._run(self._core.record_failure(aggregate_id, entry_id, attempts, error))

    def pending(
        self,
        *,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
        batch_size: int = 100,
    ) -> Iterator[Snapshot[S]]:
        """Stream the aggregates that have pending outbox entries, in ``_id`` order.

        Bad arguments raise :class:`~docoutbox.errors.InvalidInput` here, before any query.
        """
        self._core.check_pending(batch_size, older_than, partitions)
        return self._pages(older_than, partitions, batch_size)

    def _pages(
        self,
        older_than: datetime | None,
        partitions: Collection[int] | None,
        batch_size: int,
    ) -> Iterator[Snapshot[S]]:
        after: AggregateId | None = None
        while True:
            page = self._run(self._core.pending_page(after, batch_size, older_than, partitions))
            yield from page
            if len(page) < batch_size:
                return
            after = page[-1].aggregate_id

    def ensure_indexes(self) -> None:
        self.backend.ensure_indexes()


class AsyncAggregateStore(Generic[S]):
    """The async twin of :class:`AggregateStore`, over an :class:`AsyncStoreBackend`."""

    def __init__(
        self,
        backend: AsyncStoreBackend,
        model: type[S],
        config: StoreConfig | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        group_commit: bool = False,
    ) -> None:
        self.backend = backend
        self._core = Core(
            model, config or StoreConfig(), backend.document_size, backend.max_document_bytes
        )
        self._sleep = sleep
        self._batch = BatchCore(self._core, backend.document_size, backend.max_document_bytes)
        self._group: Coalescer[S, asyncio.Future[Any]] | None = (
            Coalescer() if group_commit else None
        )
        self.commit_listeners: list[Callable[[Outcome[S]], None]] = []

    @property
    def config(self) -> StoreConfig:
        return self._core.config

    async def _run(self, flow: Flow[T]) -> T:
        return await run_async(flow, self.backend, self._sleep)

    async def handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        *,
        create: bool = False,
    ) -> Outcome[S]:
        observer = self.config.observer
        if observer is None:
            return await self._handle(aggregate_id, message, handler, create)
        msg = Message.parse(message)
        with observer.handling(self._core.aggregate_type, aggregate_id, msg):
            return await self._handle(aggregate_id, msg, handler, create)

    async def _handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        create: bool,
    ) -> Outcome[S]:
        if self._group is not None:
            item = Item(Message.parse(message), handler, create)
            outcome = await handle_async(self._group, self._run_batch, aggregate_id, item)
        else:
            flow = self._core.handle(aggregate_id, message, handler, create=create)
            outcome = await self._run(flow)
        _notify(self.commit_listeners, (outcome,))
        return outcome

    async def handle_batch(
        self,
        aggregate_id: AggregateId,
        messages: Sequence[Message | dict[str, Any]],
        handler: Handler[S],
        *,
        create: bool = False,
    ) -> BatchOutcome[S]:
        items = [Item(Message.parse(m), handler, create) for m in messages]
        outcome = await self._run_batch(aggregate_id, items)
        _notify(self.commit_listeners, outcome.results)
        return outcome

    async def _run_batch(
        self, aggregate_id: AggregateId, items: Sequence[Item[S]]
    ) -> BatchOutcome[S]:
        return await self._run(self._batch.handle_batch(aggregate_id, items))

    async def create(self, aggregate_id: AggregateId, state: S) -> Created[S]:
        return await self._run(self._core.create(aggregate_id, state))

    async def load(self, aggregate_id: AggregateId) -> Snapshot[S] | None:
        return await self._run(self._core.load(aggregate_id))

    async def get(self, aggregate_id: AggregateId) -> Snapshot[S]:
        snapshot = await self.load(aggregate_id)
        if snapshot is None:
            raise NotFound(f"{self._core.aggregate_type} {aggregate_id!r} does not exist")
        return snapshot

    async def trim(self, aggregate_id: AggregateId, entry_ids: Collection[str]) -> bool:
        return await self._run(self._core.trim(aggregate_id, entry_ids))

    async def record_failure(
        self, aggregate_id: AggregateId, entry_id: str, attempts: int, error: str
    ) -> bool:
        return await self._run(self._core.record_failure(aggregate_id, entry_id, attempts, error))

    def pending(
        self,
        *,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
        batch_size: int = 100,
    ) -> AsyncIterator[Snapshot[S]]:
        """Stream the aggregates that have pending outbox entries, in ``_id`` order."""
        self._core.check_pending(batch_size, older_than, partitions)
        return self._pages(older_than, partitions, batch_size)

    async def _pages(
        self,
        older_than: datetime | None,
        partitions: Collection[int] | None,
        batch_size: int,
    ) -> AsyncIterator[Snapshot[S]]:
        after: AggregateId | None = None
        while True:
            flow = self._core.pending_page(after, batch_size, older_than, partitions)
            page = await self._run(flow)
            for snapshot in page:
                yield snapshot
            if len(page) < batch_size:
                return
            after = page[-1].aggregate_id

    async def ensure_indexes(self) -> None:
        await self.backend.ensure_indexes()


def _notify(listeners: Sequence[Callable[[Outcome[S]], None]], results: Sequence[object]) -> None:
    for result in results:
        if isinstance(result, Outcome) and result.applied and result.entries:
            for listener in listeners:
                listener(result)
