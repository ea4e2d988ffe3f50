"""The inbox archive on MongoDB: a side collection ``<collection>.inbox``.

Rule: one document per archived ID, ``_id`` = the JSON text of ``[aggregate_id,
message_id]`` (an int and a str aggregate ID never meet), with both values as fields for
readers such as the audit. Archiving is an idempotent upsert (``$setOnInsert``); a lookup
is one ``$in`` query by ``_id``. Reads and writes use the collection's read and write
concerns: with the defaults (primary reads, ``w: "majority"`` on MongoDB 5+) a finished
archive write is seen by every later read, so the token is always None.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from pymongo import UpdateOne
from pymongo import errors as pm

from docoutbox.model import AggregateId
from docoutbox_mongo.errors import DUPLICATE_KEY, translated

#: The side collection's name after the aggregate collection's.
SUFFIX = ".inbox"


def archive_name(collection: str) -> str:
    """The archive collection of the aggregate collection ``collection``."""
    return f"{collection}{SUFFIX}"


def archive_id(aggregate_id: AggregateId, message_id: str) -> str:
    return json.dumps([aggregate_id, message_id], ensure_ascii=False, separators=(",", ":"))


def upserts(aggregate_id: AggregateId, ids: Collection[str]) -> list[UpdateOne]:
    now = datetime.now(UTC)
    return [
        UpdateOne(
            {"_id": archive_id(aggregate_id, i)},
            {"$setOnInsert": {"aggregate_id": aggregate_id, "message_id": i, "archived_at": now}},
            upsert=True,
        )
        for i in dict.fromkeys(ids)
    ]


def lookup_query(aggregate_id: AggregateId, ids: Collection[str]) -> dict[str, Any]:
    """A point query for one ID (an equality on ``_id``), an ``$in`` for several."""
    wanted = [archive_id(aggregate_id, i) for i in dict.fromkeys(ids)]
    return {"_id": wanted[0] if len(wanted) == 1 else {"$in": wanted}}


def only_duplicates(exc: pm.BulkWriteError) -> bool:
    """Two upserts of one ID raced: the ID is archived either way."""
    errors = exc.details.get("writeErrors") or []
    return bool(errors) and all(e.get("code") == DUPLICATE_KEY for e in errors)


def archive_sync(archive: Any, aggregate_id: AggregateId, ids: Collection[str]) -> None:
    ops = upserts(aggregate_id, ids)
    with translated(aggregate_id):
        try:
            archive.bulk_write(ops, ordered=False)
        except pm.BulkWriteError as exc:
            if not only_duplicates(exc):
                raise


def archived_sync(archive: Any, aggregate_id: AggregateId, ids: Collection[str]) -> set[str]:
    with translated(aggregate_id):
        found = archive.find(lookup_query(aggregate_id, ids), {"message_id": 1})
        return {doc["message_id"] for doc in found}


async def archive_async(archive: Any, aggregate_id: AggregateId, ids: Collection[str]) -> None:
    ops = upserts(aggregate_id, ids)
    with translated(aggregate_id):
        try:
            await archive.bulk_write(ops, ordered=False)
        except pm.BulkWriteError as exc:
            if not only_duplicates(exc):
                raise


async def archived_async(archive: Any, aggregate_id: AggregateId, ids: Collection[str]) -> set[str]:
    with translated(aggregate_id):
        cursor = archive.find(lookup_query(aggregate_id, ids), {"message_id": 1})
        return {doc["message_id"] async for doc in cursor}
