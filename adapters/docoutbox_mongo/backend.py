"""MongoDB store backends: sync (pymongo) and async (pymongo's AsyncMongoClient or Motor).

Both execute the plans translated in :mod:`docoutbox_mongo.plans` and translate errors
in :mod:`docoutbox_mongo.errors`; they differ only in ``await``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import bson
from pymongo import ASCENDING, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, WriteError

from docoutbox.errors import InvalidPayload
from docoutbox.model import AggregateId
from docoutbox.store.document import Document
from docoutbox.store.plans import (
    CommitPlan,
    FailurePlan,
    InsertPlan,
    ReleasePlan,
    SettlePlan,
    TrimPlan,
    WritePlan,
)
from docoutbox_mongo import archive as inbox_archive
from docoutbox_mongo.errors import DRIVER_ERRORS, is_duplicate_id, translate, translated
from docoutbox_mongo.plans import (
    DUE_FILTER,
    DUE_INDEX,
    DUE_KEYS,
    INDEXES,
    PENDING_PARTITION_FILTER,
    PENDING_PARTITION_INDEX,
    PENDING_PARTITION_KEYS,
    PULL_REFUSED,
    commit_update,
    due_filter,
    failure_update,
    pending_filter,
    release_update,
    settle_update,
    trim_outbox_update,
    trim_update,
)

MAX_BSON_BYTES = 16 * 1024 * 1024


def bson_size(document: Document) -> int:
    """The exact BSON size of ``document``; InvalidPayload when it cannot be encoded."""
    try:
        inbox = document.get("inbox")
        if (type(inbox) is list or type(inbox) is tuple) and len(inbox) >= _COUNTED_INBOX:
            counted = _ascii_strings_size(inbox)
            if counted is not None:
                return len(bson.encode({**document, "inbox": []})) + counted
        return len(bson.encode(document))
    except (bson.errors.InvalidDocument, OverflowError, UnicodeEncodeError) as exc:
        raise InvalidPayload(f"document {document.get('_id')!r} is not BSON: {exc}") from exc


#: From this many inbox IDs on, :func:`bson_size` counts them instead of encoding them.
_COUNTED_INBOX = 8
_KEY_DIGITS: list[int] = [0]


def _ascii_strings_size(items: list[Any] | tuple[Any, ...]) -> int | None:
    """What the elements of a BSON array of ``items`` add to an empty array, counted
    without encoding; None unless every item is an ASCII ``str``.

    Each element is a type byte, its index as a NUL-terminated key, a 4-byte length, the
    string's UTF-8 bytes (one per character for ASCII) and a NUL. The inbox is most of a
    document's bytes, and counting it is several times faster than encoding it.
    """
    try:
        joined = "".join(items)
    except TypeError:
        return None
    if not joined.isascii():
        return None
    count = len(items)
    while len(_KEY_DIGITS) <= count:  # _KEY_DIGITS[n]: the digits of the keys 0..n-1
        _KEY_DIGITS.append(_KEY_DIGITS[-1] + len(str(len(_KEY_DIGITS) - 1)))
    return 7 * count + _KEY_DIGITS[count] + len(joined)


def _update_args(
    plan: CommitPlan | TrimPlan | FailurePlan | ReleasePlan | SettlePlan,
) -> tuple[dict[str, Any], dict[str, Any]]:
    if isinstance(plan, CommitPlan):
        return commit_update(plan)
    if isinstance(plan, TrimPlan):
        return trim_update(plan)
    if isinstance(plan, ReleasePlan):
        return release_update(plan)
    if isinstance(plan, SettlePlan):
        return settle_update(plan)
    return failure_update(plan)


def _pull_refused(exc: WriteError) -> bool:
    """Whether a trim's update was refused whole (its ``$pull`` met a malformed
    ``cancelled``): then the outbox-only update is written instead."""
    return exc.code == PULL_REFUSED


def _trims_again(plans: Sequence[WritePlan], exc: BulkWriteError) -> tuple[list[UpdateOne], int]:
    """After an unordered bulk write of ``plans`` failed with ``exc``: the outbox-only
    updates of the trims it refused whole, to be written in a second one, and how many
    documents it matched. ``exc`` is raised again when anything else failed, or failed
    otherwise: the error stands."""
    refused: list[TrimPlan] = []
    for error in exc.details.get("writeErrors", ()):
        plan = plans[error["index"]]
        if error.get("code") != PULL_REFUSED or not isinstance(plan, TrimPlan):
            raise exc
        refused.append(plan)
    if not refused:
        raise exc
    return [UpdateOne(*trim_outbox_update(p)) for p in refused], exc.details.get("nMatched", 0)


class MongoBackend:
    """Aggregate documents in a pymongo ``Collection``."""

    max_document_bytes = MAX_BSON_BYTES

    def __init__(self, collection: Any) -> None:
        self.collection = collection

    #: :func:`bson_size` itself: the store calls it once per commit.
    document_size = staticmethod(bson_size)

    def load(self, aggregate_id: AggregateId) -> Document | None:
        with translated(aggregate_id):
            doc: Document | None = self.collection.find_one({"_id": aggregate_id})
        return doc

    def write(self, plan: WritePlan) -> bool:
        if type(plan) is CommitPlan:  # every handled message: the fewest calls around it
            query, update = commit_update(plan)
            try:
                matched: int = self.collection.update_one(query, update).matched_count
            except DRIVER_ERRORS as exc:
                raise translate(exc, plan.aggregate_id) from exc
            return matched == 1
        with translated(plan.aggregate_id):
            if isinstance(plan, InsertPlan):
                try:
                    self.collection.insert_one(plan.document)
                except DuplicateKeyError as exc:
                    if not is_duplicate_id(exc):
                        raise
                    return False
                return True
            query, update = _update_args(plan)
            try:
                return bool(self.collection.update_one(query, update).matched_count == 1)
            except WriteError as exc:
                if not isinstance(plan, TrimPlan) or not _pull_refused(exc):
                    raise
            query, update = trim_outbox_update(plan)
            return bool(self.collection.update_one(query, update).matched_count == 1)

    def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
        """Several trims (or other updates) in one round trip: an unordered ``bulk_write``.

        Each result is True only when every plan matched its document (a bulk reply does
        not say which one did not). The trims refused whole (a ``cancelled`` that is not
        an array) are written again, outbox only, in a second one. Inserts, and clients
        whose ``bulk_write`` cannot take updates (mongomock, issue #912), are written one
        by one.
        """
        if len(plans) < 2 or any(isinstance(p, InsertPlan) for p in plans):
            return [self.write(p) for p in plans]
        ops = [UpdateOne(*_update_args(p)) for p in plans]  # type: ignore[arg-type]
        with translated():
            try:
                matched: int = self.collection.bulk_write(ops, ordered=False).matched_count
            except TypeError:  # mongomock: bulk_write rejects UpdateOne
                return [self.write(p) for p in plans]
            except BulkWriteError as exc:
                again, matched = _trims_again(plans, exc)
                matched += self.collection.bulk_write(again, ordered=False).matched_count
        return [matched == len(plans)] * len(plans)

    def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        query = pending_filter(after, older_than, partitions)
        with translated():
            return list(self.collection.find(query).sort("_id", ASCENDING).limit(limit))

    def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        query = due_filter(due_before, after, partitions)
        with translated():
            return list(self.collection.find(query).sort("_id", ASCENDING).limit(limit))

    @property
    def archive(self) -> Any:
        """The inbox archive's collection (:mod:`docoutbox_mongo.archive`)."""
        return self.collection.database[inbox_archive.archive_name(self.collection.name)]

    def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        inbox_archive.archive_sync(self.archive, aggregate_id, ids)
        return None

    def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        return inbox_archive.archived_sync(self.archive, aggregate_id, ids)

    def ensure_indexes(self) -> None:
        with translated():
            for name, keys in INDEXES:
                self.collection.create_index(keys, name=name)
            self.collection.create_index(
                PENDING_PARTITION_KEYS,
                name=PENDING_PARTITION_INDEX,
                partialFilterExpression=PENDING_PARTITION_FILTER,
            )
            self.collection.create_index(
                DUE_KEYS, name=DUE_INDEX, partialFilterExpression=DUE_FILTER
            )


class AsyncMongoBackend:
    """Aggregate documents in an async collection: pymongo's ``AsyncCollection`` or Motor's."""

    max_document_bytes = MAX_BSON_BYTES

    def __init__(self, collection: Any) -> None:
        self.collection = collection

    #: :func:`bson_size` itself: the store calls it once per commit.
    document_size = staticmethod(bson_size)

    async def load(self, aggregate_id: AggregateId) -> Document | None:
        with translated(aggregate_id):
            doc: Document | None = await self.collection.find_one({"_id": aggregate_id})
        return doc

    async def write(self, plan: WritePlan) -> bool:
        if type(plan) is CommitPlan:
            query, update = commit_update(plan)
            try:
                result = await self.collection.update_one(query, update)
            except DRIVER_ERRORS as exc:
                raise translate(exc, plan.aggregate_id) from exc
            return bool(result.matched_count == 1)
        with translated(plan.aggregate_id):
            if isinstance(plan, InsertPlan):
                try:
                    await self.collection.insert_one(plan.document)
                except DuplicateKeyError as exc:
                    if not is_duplicate_id(exc):
                        raise
                    return False
                return True
            query, update = _update_args(plan)
            try:
                result = await self.collection.update_one(query, update)
                return bool(result.matched_count == 1)
            except WriteError as exc:
                if not isinstance(plan, TrimPlan) or not _pull_refused(exc):
                    raise
            query, update = trim_outbox_update(plan)
            result = await self.collection.update_one(query, update)
            return bool(result.matched_count == 1)

    async def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
        """The async twin of :meth:`MongoBackend.write_many`."""
        if len(plans) < 2 or any(isinstance(p, InsertPlan) for p in plans):
            return [await self.write(p) for p in plans]
        ops = [UpdateOne(*_update_args(p)) for p in plans]  # type: ignore[arg-type]
        with translated():
            try:
                result = await self.collection.bulk_write(ops, ordered=False)
                matched: int = result.matched_count
            except TypeError:  # mongomock-motor: bulk_write rejects UpdateOne
                return [await self.write(p) for p in plans]
            except BulkWriteError as exc:
                again, matched = _trims_again(plans, exc)
                result = await self.collection.bulk_write(again, ordered=False)
                matched += result.matched_count
        return [matched == len(plans)] * len(plans)

    async def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        query = pending_filter(after, older_than, partitions)
        with translated():
            cursor = self.collection.find(query).sort("_id", ASCENDING).limit(limit)
            return [doc async for doc in cursor]

    async def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        query = due_filter(due_before, after, partitions)
        with translated():
            cursor = self.collection.find(query).sort("_id", ASCENDING).limit(limit)
            return [doc async for doc in cursor]

    @property
    def archive(self) -> Any:
        """The inbox archive's collection (:mod:`docoutbox_mongo.archive`)."""
        return self.collection.database[inbox_archive.archive_name(self.collection.name)]

    async def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        await inbox_archive.archive_async(self.archive, aggregate_id, ids)
        return None

    async def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        return await inbox_archive.archived_async(self.archive, aggregate_id, ids)

    async def ensure_indexes(self) -> None:
        with translated():
            for name, keys in INDEXES:
                await self.collection.create_index(keys, name=name)
            await self.collection.create_index(
                PENDING_PARTITION_KEYS,
                name=PENDING_PARTITION_INDEX,
                partialFilterExpression=PENDING_PARTITION_FILTER,
            )
            await self.collection.create_index(
                DUE_KEYS, name=DUE_INDEX, partialFilterExpression=DUE_FILTER
            )
