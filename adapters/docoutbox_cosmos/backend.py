"""Cosmos DB store backends: sync (``azure.cosmos``) and async (``azure.cosmos.aio``).

Both drive the flows of :mod:`docoutbox_cosmos.operations` and differ only in
``await``: each request is sent by :meth:`_send`, resent after ``x-ms-retry-after-ms``
while throttled, and its failure translated by :mod:`docoutbox_cosmos.errors`. Every
response's request charge (``x-ms-request-charge``) goes to the ``on_charge`` hook.

A 404 that may be the container's rather than the item's (see
:func:`~docoutbox_cosmos.errors.owner_missing`) is checked against the container once,
until the container has been seen: a missing container or database is
:class:`~docoutbox_cosmos.errors.ContainerNotFound`, never "no such item".
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from azure.core import MatchConditions

from docoutbox.model import AggregateId
from docoutbox.store.document import Document
from docoutbox.store.plans import WritePlan
from docoutbox_cosmos import operations as flows
from docoutbox_cosmos.archive import AsyncCosmosInboxArchive, CosmosInboxArchive
from docoutbox_cosmos.errors import (
    DRIVER_ERRORS,
    owner_missing,
    refusal,
    retry_after,
    translate,
)
from docoutbox_cosmos.existence import require_container, require_container_async
from docoutbox_cosmos.items import MAX_ITEM_BYTES, ItemCodec, json_size

#: Bytes an item carries beyond its document: id and aid (255 characters each at most,
#: escaped), a partition-key field, and _rid/_self/_etag/_ts/_attachments/_lsn.
ITEM_OVERHEAD = 1024
#: How many items' outbox entry IDs a backend remembers for trims.
REMEMBERED_ITEMS = 1024
#: Called after every response with (request kind, HTTP status, request charge in RU).
ChargeHook = Callable[[str, int, float], None]


def _charge(response: Any) -> tuple[int, float]:
    http = response.http_response
    try:
        charge = float(http.headers.get("x-ms-request-charge") or 0.0)
    except ValueError:
        charge = 0.0
    return int(http.status_code), charge


class _Base:
    max_document_bytes = MAX_ITEM_BYTES

    def __init__(
        self,
        container: Any,
        *,
        partition_key_path: str = "/id",
        partition_key: Callable[[AggregateId], str] | None = None,
        on_charge: ChargeHook | None = None,
        inbox_archive: Any = None,
    ) -> None:
        self.container = container
        self.codec = ItemCodec(partition_key_path, partition_key)
        #: The container of spilled inbox IDs (:mod:`docoutbox_cosmos.archive`), if any.
        self.inbox_archive = inbox_archive
        self.on_charge = on_charge
        self._outboxes: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self._memory_lock = threading.Lock()
        #: Whether the container was seen to exist (an answer, or a check).
        self._container_seen = False

    def _suspect(self, request: flows.Request, exc: BaseException) -> bool:
        """Whether ``exc`` may mean the container or its database is missing, and the
        container must be checked before the answer is taken for the item's."""
        verdict = owner_missing(exc, isinstance(request, flows.Create | flows.Query))
        return verdict is True or (verdict is None and not self._container_seen)

    def _remember(self, item: Any) -> None:
        """Keep the entry IDs of the item's outbox, for a trim's first attempt."""
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            return
        outbox = item.get("outbox")
        if not isinstance(outbox, list):
            return
        ids = tuple(e.get("id") for e in outbox if isinstance(e, dict))
        with self._memory_lock:
            self._outboxes[item["id"]] = ids
            self._outboxes.move_to_end(item["id"])
            while len(self._outboxes) > REMEMBERED_ITEMS:
                self._outboxes.popitem(last=False)

    def _recalled(self, request: flows.Recall) -> Any:
        with self._memory_lock:
            ids = self._outboxes.get(request.item_id)
        if ids is None:
            return None
        return flows.hinted(ids)

    @property
    def has_inbox_archive(self) -> bool:
        """Whether the backend was given an archive container (``inbox_archive``)."""
        return self.inbox_archive is not None

    def _archive_key(self, aggregate_id: AggregateId) -> str:
        return self.codec.key(aggregate_id)[1]

    def document_size(self, document: Document) -> int:
        """An upper bound of the item's size: compact UTF-8 JSON plus ``id``, ``aid``, the
        partition-key field and the system properties (at most :data:`ITEM_OVERHEAD`)."""
        return json_size(document) + ITEM_OVERHEAD

    def _hooks(self, kind: str) -> dict[str, Any]:
        hook = self.on_charge
        if hook is None:
            return {}

        def raw(response: Any) -> None:
            status, charge = _charge(response)
            hook(kind, status, charge)

        return {"raw_response_hook": raw}

    def _call(self, request: flows.Request) -> tuple[Any, dict[str, Any]]:
        """The container method and arguments for ``request``."""
        c = self.container
        if isinstance(request, flows.Read | flows.Recall):
            return c.read_item, {
                "item": request.item_id,
                "partition_key": request.partition_key,
                **self._hooks("read"),
            }
        if isinstance(request, flows.Create):
            return c.create_item, {"body": request.item, **self._hooks("create")}
        if isinstance(request, flows.Patch):
            guard: dict[str, Any] = (
                {"filter_predicate": request.predicate}
                if request.etag is None
                else {"etag": request.etag, "match_condition": MatchConditions.IfNotModified}
            )
            return c.patch_item, {
                "item": request.item_id,
                "partition_key": request.partition_key,
                "patch_operations": request.ops,
                **guard,
                **self._hooks("patch"),
            }
        if isinstance(request, flows.Replace):
            return c.replace_item, {
                "item": request.item["id"],
                "body": request.item,
                "etag": request.etag,
                "match_condition": MatchConditions.IfNotModified,
                **self._hooks("replace"),
            }
        raise TypeError(request)

    def _query_args(self, request: flows.Query) -> dict[str, Any]:
        return {"query": request.sql, "parameters": request.parameters, **self._hooks("query")}


def _remembering(backend: _Base, request: flows.Request, answer: Any) -> Any:
    backend._container_seen = True
    if not isinstance(request, flows.Query):
        backend._remember(answer)
    return answer


def _expected(request: flows.Request, exc: BaseException) -> Any:
    """The answer an expected refusal stands for, or raise it translated."""
    kind = refusal(exc)
    if kind is not None and not isinstance(request, flows.Query):
        return None if isinstance(request, flows.Read | flows.Recall) else kind
    raise translate(exc, getattr(request, "item_id", None)) from exc


class CosmosBackend(_Base):
    """Aggregate documents as items of an ``azure.cosmos`` ``ContainerProxy``."""

    def __init__(self, container: Any, **options: Any) -> None:
        super().__init__(container, **options)
        self.sleep: Callable[[float], None] = time.sleep

    def _send(self, request: flows.Request) -> Any:
        attempt = 0
        while True:
            try:
                if isinstance(request, flows.Query):
                    pages = self.container.query_items(
                        enable_cross_partition_query=True, **self._query_args(request)
                    )
                    return _remembering(self, request, list(pages))
                if isinstance(request, flows.Recall) and (known := self._recalled(request)):
                    return known
                method, kwargs = self._call(request)
                return _remembering(self, request, method(**kwargs))
            except DRIVER_ERRORS as exc:
                wait = retry_after(exc, attempt)
                if wait is None:
                    if self._suspect(request, exc):
                        require_container(self.container)
                        self._container_seen = True
                    return _expected(request, exc)
                attempt += 1
                self.sleep(wait)

    def _run(self, flow: flows.Flow) -> Any:
        answer: Any = None
        while True:
            try:
                request = flow.send(answer)
            except StopIteration as stop:
                return stop.value
            answer = self._send(request)

    def load(self, aggregate_id: AggregateId) -> Document | None:
        doc: Document | None = self._run(flows.load(self.codec, aggregate_id))
        return doc

    def write(self, plan: WritePlan) -> bool:
        return bool(self._run(flows.write(self.codec, plan)))

    def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        flow = flows.find_pending(self.codec, after, limit, older_than, partitions)
        docs: list[Document] = self._run(flow)
        return docs

    def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        """Documents whose scheduled entries fell due by ``due_before`` (one query across
        partitions; a dispatcher owning feed ranges keeps those of its ranges)."""
        flow = flows.find_due(self.codec, due_before, after, limit, partitions)
        docs: list[Document] = self._run(flow)
        return docs

    def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        """Upsert spilled inbox IDs into the archive container; its session token."""
        archive = CosmosInboxArchive(self.inbox_archive, self._archive_key)
        return archive.archive(aggregate_id, ids)

    def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        """Which of ``ids`` the archive container holds, read with ``token``."""
        archive = CosmosInboxArchive(self.inbox_archive, self._archive_key)
        return archive.archived(aggregate_id, ids, token)

    def ensure_indexes(self) -> None:
        """Check the container exists (:class:`~docoutbox_cosmos.errors.ContainerNotFound`
        otherwise); no index to create: Cosmos DB's default indexing policy covers every
        query here."""
        require_container(self.container)
        self._container_seen = True


class AsyncCosmosBackend(_Base):
    """Aggregate documents as items of an ``azure.cosmos.aio`` ``ContainerProxy``."""

    async def _send(self, request: flows.Request) -> Any:
        attempt = 0
        while True:
            try:
                if isinstance(request, flows.Query):
                    pages = self.container.query_items(**self._query_args(request))
                    return _remembering(self, request, [item async for item in pages])
                if isinstance(request, flows.Recall) and (known := self._recalled(request)):
                    return known
                method, kwargs = self._call(request)
                return _remembering(self, request, await method(**kwargs))
            except DRIVER_ERRORS as exc:
                wait = retry_after(exc, attempt)
                if wait is None:
                    if self._suspect(request, exc):
                        await require_container_async(self.container)
                        self._container_seen = True
                    return _expected(request, exc)
                attempt += 1
                await asyncio.sleep(wait)

    async def _run(self, flow: flows.Flow) -> Any:
        answer: Any = None
        while True:
            try:
                request = flow.send(answer)
            except StopIteration as stop:
                return stop.value
            answer = await self._send(request)

    async def load(self, aggregate_id: AggregateId) -> Document | None:
        doc: Document | None = await self._run(flows.load(self.codec, aggregate_id))
        return doc

    async def write(self, plan: WritePlan) -> bool:
        return bool(await self._run(flows.write(self.codec, plan)))

    async def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        flow = flows.find_pending(self.codec, after, limit, older_than, partitions)
        docs: list[Document] = await self._run(flow)
        return docs

    async def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        flow = flows.find_due(self.codec, due_before, after, limit, partitions)
        docs: list[Document] = await self._run(flow)
        return docs

    async def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        """Upsert spilled inbox IDs into the archive container; its session token."""
        archive = AsyncCosmosInboxArchive(self.inbox_archive, self._archive_key)
        return await archive.archive(aggregate_id, ids)

    async def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        """Which of ``ids`` the archive container holds, read with ``token``."""
        archive = AsyncCosmosInboxArchive(self.inbox_archive, self._archive_key)
        return await archive.archived(aggregate_id, ids, token)

    async def ensure_indexes(self) -> None:
        """See :meth:`CosmosBackend.ensure_indexes`."""
        await require_container_async(self.container)
        self._container_seen = True
