"""An in-memory store backend with the semantics of :func:`~docoutbox.store.plans.apply_plan`."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Collection
from datetime import datetime
from typing import Any

from docoutbox.model import AggregateId
from docoutbox.store.document import ID, Document
from docoutbox.store.plans import WritePlan, apply_plan
from docoutbox.store.schedule import DUE, EARLIEST_DUE, as_utc

MONGODB_MAX_BYTES = 16 * 1024 * 1024


def json_size(document: Document) -> int:
    """The size of ``document`` as compact JSON, in bytes."""
    return len(json.dumps(document, default=str, separators=(",", ":")).encode())


def _order(aggregate_id: AggregateId) -> tuple[int, Any]:
    return (0, aggregate_id) if isinstance(aggregate_id, int) else (1, aggregate_id)


def _aged(entry: Document, older_than: datetime) -> bool:
    """Whether ``entry`` has been pending since before ``older_than``: created before it,
    and, if scheduled, due before it too."""
    if not entry["created_at"] < older_than:
        return False
    due = as_utc(entry.get(DUE))
    return due is None or due < older_than


class MemoryBackend:
    """Documents in a dict, guarded by a lock. Every write is recorded in ``changes``."""

    def __init__(self, *, max_document_bytes: int = MONGODB_MAX_BYTES) -> None:
        self.max_document_bytes = max_document_bytes
        self.docs: dict[AggregateId, Document] = {}
        self.changes: list[Document] = []
        #: The inbox archive: spilled inbox IDs per aggregate (:mod:`docoutbox.store.spill`).
        self.archive: dict[AggregateId, set[str]] = {}
        self._lock = threading.Lock()

    def document_size(self, document: Document) -> int:
        return json_size(document)

    def load(self, aggregate_id: AggregateId) -> Document | None:
        with self._lock:
            doc = self.docs.get(aggregate_id)
            return copy.deepcopy(doc) if doc is not None else None

    def write(self, plan: WritePlan) -> bool:
        with self._lock:
            after = apply_plan(self.docs.get(plan.aggregate_id), plan)
            if after is None:
                return False
            after = copy.deepcopy(after)
            if type(after.get("inbox")) is tuple:  # stored as a database returns an array
                after["inbox"] = list(after["inbox"])
            self.docs[plan.aggregate_id] = after
            self.changes.append(copy.deepcopy(after))
            return True

    def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        with self._lock:
            found = []
            for doc in self.docs.values():
                outbox = doc.get("outbox") or []
                if not outbox:
                    continue
                if after is not None and _order(doc[ID]) <= _order(after):
                    continue
                if older_than is not None and not any(_aged(e, older_than) for e in outbox):
                    continue
                if partitions is not None and doc.get("partition") not in partitions:
                    continue
                found.append(doc)
            found.sort(key=lambda d: _order(d[ID]))
            return copy.deepcopy(found[:limit])

    def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        """Documents whose ``earliest_due`` is at or before ``due_before``, by ``_id``."""
        with self._lock:
            found = []
            for doc in self.docs.values():
                due = as_utc(doc.get(EARLIEST_DUE))
                if due is None or due > due_before:
                    continue
                if after is not None and _order(doc[ID]) <= _order(after):
                    continue
                if partitions is not None and doc.get("partition") not in partitions:
                    continue
                found.append(doc)
            found.sort(key=lambda d: _order(d[ID]))
            return copy.deepcopy(found[:limit])

    def ensure_indexes(self) -> None:
        return None

    def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        with self._lock:
            self.archive.setdefault(aggregate_id, set()).update(ids)
            return None

    def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        with self._lock:
            return self.archive.get(aggregate_id, set()).intersection(ids)


class AsyncMemoryBackend:
    """The async twin of :class:`MemoryBackend`, sharing its documents."""

    def __init__(self, sync: MemoryBackend | None = None) -> None:
        self.sync = sync or MemoryBackend()
        self.max_document_bytes = self.sync.max_document_bytes

    def document_size(self, document: Document) -> int:
        return self.sync.document_size(document)

    async def load(self, aggregate_id: AggregateId) -> Document | None:
        return self.sync.load(aggregate_id)

    async def write(self, plan: WritePlan) -> bool:
        return self.sync.write(plan)

    async def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        return self.sync.find_pending(
            after=after, limit=limit, older_than=older_than, partitions=partitions
        )

    async def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        return self.sync.find_due(
            due_before=due_before, after=after, limit=limit, partitions=partitions
        )

    async def ensure_indexes(self) -> None:
        return None

    async def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        return self.sync.archive_inbox(aggregate_id, ids)

    async def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        return self.sync.archived_inbox(aggregate_id, ids, token)
