"""The public stores: thin sync and async drivers over the flows in :mod:`docoutbox.store.core`."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from docoutbox.drive import drive, drive_async
from docoutbox.errors import InvalidConfig, InvalidMessage, NotFound
from docoutbox.handlers import Handler, check_handling
from docoutbox.model import AggregateId, Message
from docoutbox.ports.archive import check_archive
from docoutbox.ports.payloads import AsyncPayloadStore, IndexedPayloads, PayloadStore
from docoutbox.ports.store import AsyncStoreBackend, StoreBackend
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
from docoutbox.store.spill import Archive, Archived
from docoutbox.stored.claim import PutPayload, perform_payload, perform_payload_async

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")


def _perform(
    backend: StoreBackend,
    sleep: Callable[[float], None],
    payloads: PayloadStore | None,
    op: Op,
) -> Any:
    """Perform one operation of a store flow on a sync backend (each store binds the
    first three arguments once, with ``partial``)."""
    if isinstance(op, Write):  # a commit's only operation on a warm cache: tested first
        return backend.write(op.plan)
    if isinstance(op, PutPayload):
        return perform_payload(op, payloads)
    if isinstance(op, Load):
        return backend.load(op.aggregate_id)
    if isinstance(op, FindPending):
        return backend.find_pending(
            after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
        )
    if isinstance(op, Archived):
        return backend.archived_inbox(op.aggregate_id, op.ids, op.token)  # type: ignore[attr-defined]
    if isinstance(op, Archive):
        return backend.archive_inbox(op.aggregate_id, op.ids)  # type: ignore[attr-defined]
    sleep(op.seconds)
    return None


async def _perform_async(
    backend: AsyncStoreBackend,
    sleep: Callable[[float], Awaitable[None]],
    payloads: AsyncPayloadStore | None,
    op: Op,
) -> Any:
    """The async twin of :func:`_perform`."""
    if isinstance(op, Write):
        return await backend.write(op.plan)
    if isinstance(op, PutPayload):
        return await perform_payload_async(op, payloads)
    if isinstance(op, Load):
        return await backend.load(op.aggregate_id)
    if isinstance(op, FindPending):
        return await backend.find_pending(
            after=op.after, limit=op.limit, older_than=op.older_than, partitions=op.partitions
        )
    if isinstance(op, Archived):
        return await backend.archived_inbox(op.aggregate_id, op.ids, op.token)  # type: ignore[attr-defined]
    if isinstance(op, Archive):
        return await backend.archive_inbox(op.aggregate_id, op.ids)  # type: ignore[attr-defined]
    await sleep(op.seconds)
    return None


@dataclass(frozen=True)
class _PendingQuery:
    """The checked arguments of ``pending()``."""

    older_than: datetime | None
    partitions: Collection[int] | None
    batch_size: int


def _check_store_arguments(backend: object, model: object, config: object) -> None:
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise InvalidConfig(f"model must be a pydantic model class, got {model!r}")
    if config is not None and not isinstance(config, StoreConfig):
        raise InvalidConfig(f"config must be a StoreConfig, got {type(config).__name__}")
    if not isinstance(backend, StoreBackend | AsyncStoreBackend):
        raise InvalidConfig(f"backend must be a store backend, got {type(backend).__name__}")


def _payloads(config: StoreConfig | None, *, asynchronous: bool) -> Any:
    """The claim check's payload store, checked once: it must be sync for a sync store
    and async for an async one (None: no claim check)."""
    claim = config.claim_check if config is not None else None
    if claim is None:
        return None
    if claim.asynchronous != asynchronous:
        kind = "an async" if asynchronous else "a sync"
        raise InvalidConfig(
            f"ClaimCheck.payloads must be {kind} payload store for this store, "
            f"got {type(claim.payloads).__name__}"
        )
    return claim.payloads


def _indexed(backend: object, payloads: object, *, asynchronous: bool) -> list[Any]:
    """What a store's ``ensure_indexes`` sets up, in order: the backend's collection, then
    the claim check's payload store when it has indexes of its own (:class:`IndexedPayloads`:
    MongoDB's side collection), whose ``ensure_indexes`` must be async for an async store
    and sync for a sync one. Sync and async stores call ``ensure_indexes`` on each."""
    if not isinstance(payloads, IndexedPayloads):
        return [backend]
    if inspect.iscoroutinefunction(payloads.ensure_indexes) != asynchronous:
        kind = "async" if asynchronous else "sync"
        raise InvalidConfig(
            f"{type(payloads).__name__}.ensure_indexes must be {kind}, as its put is"
        )
    return [backend, payloads]


def _check_driver(backend: object, *, asynchronous: bool) -> None:
    """A sync store over an async backend (or the reverse) failed on its first call with
    an AttributeError or TypeError from deep inside the flow."""
    if not isinstance(backend, StoreBackend | AsyncStoreBackend):
        return  # refused by _check_store_arguments
    if inspect.iscoroutinefunction(backend.load) == asynchronous:
        return
    name = type(backend).__name__
    if asynchronous:
        raise InvalidConfig(
            f"AsyncAggregateStore needs an async backend (AsyncStoreBackend), got {name}"
        )
    raise InvalidConfig(f"AggregateStore needs a sync backend (StoreBackend), got {name}")


class _StoreFlows(Generic[S]):
    """What both stores share: their argument checks, flows and result shaping.

    Each public method of :class:`AggregateStore` and :class:`AsyncAggregateStore` drives
    one of these flows (sync or async) and does nothing else of its own.
    """

    def __init__(
        self,
        backend: StoreBackend | AsyncStoreBackend,
        model: type[S],
        config: StoreConfig | None,
        *,
        asynchronous: bool,
    ) -> None:
        _check_driver(backend, asynchronous=asynchronous)
        _check_store_arguments(backend, model, config)
        check_archive(backend, (config or StoreConfig()).inbox.spill)
        self._core = Core(
            model, config or StoreConfig(), backend.document_size, backend.max_document_bytes
        )
        self._batch = BatchCore(self._core, backend.document_size, backend.max_document_bytes)
        #: Called with every outcome that committed new outbox entries (immediate dispatch).
        self.commit_listeners: list[Callable[[Outcome[S]], None]] = []
        #: The claim check's payload store, sync or async as the store (None: none).
        self._payloads: Any = _payloads(config, asynchronous=asynchronous)
        #: What ``ensure_indexes`` sets up.
        self._indexed = _indexed(backend, self._payloads, asynchronous=asynchronous)

    @property
    def config(self) -> StoreConfig:
        return self._core.config

    def _observed(
        self, aggregate_id: AggregateId, message: Message | dict[str, Any]
    ) -> tuple[Message, AbstractContextManager[object]] | None:
        """The parsed message and the observer's span around its handling, if observed."""
        observer = self._core.config.observer
        if observer is None:
            return None
        msg = Message.parse(message)
        return msg, observer.handling(self._core.aggregate_type, aggregate_id, msg)

    def _item(
        self, message: Message | dict[str, Any], handler: Handler[S], create: bool
    ) -> Item[S]:
        check_handling(handler, create)
        return Item(Message.parse(message), handler, create)

    def _batch_flow(
        self,
        aggregate_id: AggregateId,
        messages: Sequence[Message | dict[str, Any]],
        handler: Handler[S],
        create: bool,
    ) -> Flow[BatchOutcome[S]]:
        if isinstance(messages, str | bytes | dict | BaseModel) or not isinstance(
            messages, Iterable
        ):
            raise InvalidMessage(
                f"messages must be a sequence of messages, got {type(messages).__name__}"
            )
        items = [self._item(m, handler, create) for m in messages]
        outcome = yield from self._batch.handle_batch(aggregate_id, items)
        self._notify(outcome.results)
        return outcome

    def _get_flow(self, aggregate_id: AggregateId) -> Flow[Snapshot[S]]:
        snapshot = yield from self._core.load(aggregate_id)
        if snapshot is None:
            raise NotFound(f"{self._core.aggregate_type} {aggregate_id!r} does not exist")
        return snapshot

    def _pending_query(
        self,
        older_than: datetime | None,
        partitions: Collection[int] | None,
        batch_size: int,
    ) -> _PendingQuery:
        """Refuse bad arguments with :class:`~docoutbox.errors.InvalidInput`, before any
        query."""
        self._core.check_pending(batch_size, older_than, partitions)
        return _PendingQuery(older_than, partitions, batch_size)

    def _page_flow(
        self, query: _PendingQuery, after: AggregateId | None
    ) -> Flow[tuple[list[Snapshot[S]], AggregateId | None]]:
        """One page, and where the next starts (None after the last page)."""
        page = yield from self._core.pending_page(
            after, query.batch_size, query.older_than, query.partitions
        )
        return page, (None if len(page) < query.batch_size else page[-1].aggregate_id)

    def _notify(self, results: Sequence[object]) -> None:
        listeners = self.commit_listeners
        if not listeners:
            return
        for result in results:
            if isinstance(result, Outcome) and result.applied and result.entries:
                for listener in listeners:
                    listener(result)


class AggregateStore(_StoreFlows[S]):
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
        super().__init__(backend, model, config, asynchronous=False)
        self.backend = backend
        self._sleep = sleep
        self._group: Coalescer[S, Future[Any]] | None = Coalescer() if group_commit else None
        #: Performs one operation of a flow; made once, as every call drives flows.
        self._perform: Callable[[Op], Any] = partial(_perform, backend, sleep, self._payloads)

    def _run(self, flow: Flow[T]) -> T:
        return drive(flow, self._perform)

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
        if self._core.config.observer is None:
            return self._handle(aggregate_id, message, handler, create)
        observed = self._observed(aggregate_id, message)
        assert observed is not None
        with observed[1]:
            return self._handle(aggregate_id, observed[0], handler, create)

    def _handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        create: bool,
    ) -> Outcome[S]:
        if self._group is None:
            flow = self._core.handle(aggregate_id, message, handler, create=create)
            outcome = drive(flow, self._perform)
        else:
            item = self._item(message, handler, create)
            outcome = handle_sync(self._group, self._run_batch, aggregate_id, item)
        if self.commit_listeners:
            self._notify((outcome,))
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
        return self._run(self._batch_flow(aggregate_id, messages, handler, create))

    def _run_batch(self, aggregate_id: AggregateId, items: Sequence[Item[S]]) -> BatchOutcome[S]:
        return self._run(self._batch.handle_batch(aggregate_id, items))

    def create(self, aggregate_id: AggregateId, state: S) -> Created[S]:
        """Create the aggregate unless it exists; either way return what is stored."""
        return self._run(self._core.create(aggregate_id, state))

    def load(self, aggregate_id: AggregateId) -> Snapshot[S] | None:
        return self._run(self._core.load(aggregate_id))

    def get(self, aggregate_id: AggregateId) -> Snapshot[S]:
        """The aggregate; :class:`~docoutbox.errors.NotFound` if it does not exist."""
        return self._run(self._get_flow(aggregate_id))

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
        return self._pages(self._pending_query(older_than, partitions, batch_size))

    def _pages(self, query: _PendingQuery) -> Iterator[Snapshot[S]]:
        page, after = self._run(self._page_flow(query, None))
        yield from page
        while after is not None:
            page, after = self._run(self._page_flow(query, after))
            yield from page

    def ensure_indexes(self) -> None:
        """Create every index the store's queries use (idempotent; an explicit set-up
        step, never done on import): the collection's, and its claim check's payload
        store's when that has any."""
        for part in self._indexed:
            part.ensure_indexes()


class AsyncAggregateStore(_StoreFlows[S]):
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
        super().__init__(backend, model, config, asynchronous=True)
        self.backend = backend
        self._sleep = sleep
        self._group: Coalescer[S, asyncio.Future[Any]] | None = (
            Coalescer() if group_commit else None
        )
        self._perform: Callable[[Op], Awaitable[Any]] = partial(
            _perform_async, backend, sleep, self._payloads
        )

    async def _run(self, flow: Flow[T]) -> T:
        return await drive_async(flow, self._perform)

    async def handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        *,
        create: bool = False,
    ) -> Outcome[S]:
        if self._core.config.observer is None:
            return await self._handle(aggregate_id, message, handler, create)
        observed = self._observed(aggregate_id, message)
        assert observed is not None
        with observed[1]:
            return await self._handle(aggregate_id, observed[0], handler, create)

    async def _handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        create: bool,
    ) -> Outcome[S]:
        if self._group is None:
            flow = self._core.handle(aggregate_id, message, handler, create=create)
            outcome = await drive_async(flow, self._perform)
        else:
            item = self._item(message, handler, create)
            outcome = await handle_async(self._group, self._run_batch, aggregate_id, item)
        if self.commit_listeners:
            self._notify((outcome,))
        return outcome

    async def handle_batch(
        self,
        aggregate_id: AggregateId,
        messages: Sequence[Message | dict[str, Any]],
        handler: Handler[S],
        *,
        create: bool = False,
    ) -> BatchOutcome[S]:
        return await self._run(self._batch_flow(aggregate_id, messages, handler, create))

    async def _run_batch(
        self, aggregate_id: AggregateId, items: Sequence[Item[S]]
    ) -> BatchOutcome[S]:
        return await self._run(self._batch.handle_batch(aggregate_id, items))

    async def create(self, aggregate_id: AggregateId, state: S) -> Created[S]:
        return await self._run(self._core.create(aggregate_id, state))

    async def load(self, aggregate_id: AggregateId) -> Snapshot[S] | None:
        return await self._run(self._core.load(aggregate_id))

    async def get(self, aggregate_id: AggregateId) -> Snapshot[S]:
        return await self._run(self._get_flow(aggregate_id))

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
        return self._pages(self._pending_query(older_than, partitions, batch_size))

    async def _pages(self, query: _PendingQuery) -> AsyncIterator[Snapshot[S]]:
        after: AggregateId | None = None
        while True:
            page, after = await self._run(self._page_flow(query, after))
            for snapshot in page:
                yield snapshot
            if after is None:
                return

    async def ensure_indexes(self) -> None:
        """The async twin of :meth:`AggregateStore.ensure_indexes`."""
        for part in self._indexed:
            await part.ensure_indexes()
