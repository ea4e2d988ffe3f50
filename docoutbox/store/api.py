"""The public stores: thin sync and async drivers over the flows in :mod:`docoutbox.store.core`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from docoutbox.errors import NotFound
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
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
from docoutbox.store.ports import AsyncStoreBackend, StoreBackend

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")


def run_sync(flow: Flow[T], backend: StoreBackend, sleep: Callable[[float], None]) -> T:
    """Drive ``flow`` against a sync backend."""
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = flow.send(send) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            send = _perform(op, backend, sleep)
        except Exception as exc:  # noqa: BLE001 - handed to the flow, which decides
            error = exc


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
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = flow.send(send) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            send = await _perform_async(op, backend, sleep)
        except Exception as exc:  # noqa: BLE001 - handed to the flow, which decides
            error = exc


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
    ) -> None:
        self.backend = backend
        self._core = Core(
            model, config or StoreConfig(), backend.document_size, backend.max_document_bytes
        )
        self._sleep = sleep

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

        With ``create=True`` a missing aggregate starts from the model's defaults.
        """
        return self._run(self._core.handle(aggregate_id, message, handler, create=create))

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
    ) -> None:
        self.backend = backend
        self._core = Core(
            model, config or StoreConfig(), backend.document_size, backend.max_document_bytes
        )
        self._sleep = sleep

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
        return await self._run(self._core.handle(aggregate_id, message, handler, create=create))

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
