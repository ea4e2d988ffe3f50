"""Dispatcher coordination in MongoDB collections: checkpoints, leases, dead letters.

- :class:`MongoCheckpoints`: ``{_id: <dispatcher name>, token, updated_at}``.
- :class:`MongoLeaseTable`: per group, one document per partition,
  ``{_id: "<group>/<partition>", group, kind: "lease", partition, owner, expires_at}``,
  and one membership heartbeat per instance, ``{_id: "<group>/member/<owner>", ...}``.
  Acquiring is a conditional upsert: a race loser gets ``DuplicateKeyError`` (or matches
  nothing) and simply does not get the partition.
- :class:`MongoDeadLetters`: ``{_id: <entry id>, aggregate_id, entry, error, attempts,
  quarantined_at, origin}`` (``origin`` "dispatch", or "consume" with ``queue`` and the
  raw ``body``); a second ``put`` of the same entry is a no-op. ``refers_to`` answers the
  orphan sweep and the dispatcher before it deletes a published entry's payload: whether
  a dead letter holds a claim-checked entry with a payload, by the sparse index
  :data:`DEAD_LETTER_INDEXES` (``ensure_indexes``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import DuplicateKeyError

from docoutbox.model import AggregateId
from docoutbox.ports.dispatch import LeaseView, Position
from docoutbox.store.document import utcnow
from docoutbox_mongo.errors import translated

#: The dead letters' index of ``refers_to`` (``(name, keys, options)``): sparse, as only
#: claim-checked entries have a ``claim``.
DEAD_LETTER_INDEXES: tuple[tuple[str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("docoutbox_dead_letter_claim", [("entry.claim.id", 1)], {"sparse": True}),
)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class MongoCheckpoints:
    def __init__(self, collection: Any) -> None:
        self.collection = collection

    def load(self, name: str) -> Position | None:
        with translated():
            doc = self.collection.find_one({"_id": name})
        return None if doc is None else doc.get("token")

    def save(self, name: str, position: Position) -> None:
        with translated():
            self.collection.update_one(
                {"_id": name}, {"$set": {"token": position, "updated_at": utcnow()}}, upsert=True
            )


class MongoLeaseTable:
    """The leases of one ``group`` (usually the dispatched collection's name)."""

    def __init__(self, collection: Any, group: str) -> None:
        self.collection = collection
        self.group = group

    def _lease_id(self, partition: int) -> str:
        return f"{self.group}/{partition}"

    def _member_id(self, owner: str) -> str:
        return f"{self.group}/member/{owner}"

    def read(self) -> LeaseView:
        leases: dict[int, tuple[str, datetime]] = {}
        members: dict[str, datetime] = {}
        with translated():
            docs = list(self.collection.find({"group": self.group}))
        for doc in docs:
            owner, expires = doc.get("owner"), doc.get("expires_at")
            if not isinstance(owner, str) or not isinstance(expires, datetime):
                continue
            if doc.get("kind") == "member":
                members[owner] = _aware(expires)
            elif doc.get("kind") == "lease" and isinstance(doc.get("partition"), int):
                leases[doc["partition"]] = (owner, _aware(expires))
        return LeaseView(leases, members)

    def join(self, owner: str, expires_at: datetime) -> None:
        fields = {"group": self.group, "kind": "member", "owner": owner, "expires_at": expires_at}
        with translated():
            self.collection.update_one(
                {"_id": self._member_id(owner)},
                {"$set": fields, "$setOnInsert": {"joined_at": utcnow()}},
                upsert=True,
            )

    def leave(self, owner: str) -> None:
        with translated():
            self.collection.delete_one({"_id": self._member_id(owner)})

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        query = {
            "_id": self._lease_id(partition),
            "$or": [{"expires_at": {"$lt": now}}, {"owner": owner}],
        }
        fields = {
            "group": self.group,
            "kind": "lease",
            "partition": partition,
            "owner": owner,
            "expires_at": expires_at,
            # Callers acquire partitions they do not hold (and renew those they do), so
            # this is when the current owner took it over.
            "acquired_at": now,
        }
        with translated():
            try:
                result = self.collection.update_one(query, {"$set": fields}, upsert=True)
            except DuplicateKeyError:
                return False  # someone else holds it
        return bool(result.matched_count == 1 or result.upserted_id is not None)

    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        ids = [self._lease_id(p) for p in partitions]
        with translated():
            self.collection.update_many(
                {"_id": {"$in": ids}, "owner": owner}, {"$set": {"expires_at": expires_at}}
            )

    def release(self, partition: int, owner: str) -> None:
        with translated():
            self.collection.delete_one({"_id": self._lease_id(partition), "owner": owner})


def dead_letter(
    aggregate_id: AggregateId | None, entry: dict[str, Any], error: str, attempts: int
) -> dict[str, Any]:
    """The dead-letter document of ``entry``; its ``_id`` is the entry ID (or a digest)."""
    entry_id = entry.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        digest = hashlib.sha256(repr(sorted(entry.items(), key=str)).encode()).hexdigest()
        entry_id = f"{aggregate_id}/malformed/{digest[:24]}"
    return {
        "_id": entry_id,
        "aggregate_id": aggregate_id,
        "entry": entry,
        "error": error,
        "attempts": attempts,
        "quarantined_at": utcnow(),
    }


def consumer_dead_letter(
    aggregate_id: AggregateId | None,
    entry: dict[str, Any],
    error: str,
    attempts: int,
    origin: str,
    queue: str | None,
    body: str | bytes | None,
) -> dict[str, Any]:
    """:func:`dead_letter` with where it comes from: ``origin``, a consumer's ``queue`` and
    the raw ``body``."""
    doc = dead_letter(aggregate_id, entry, error, attempts)
    doc["origin"] = origin
    if aggregate_id is None and queue is not None and "/malformed/" in str(doc["_id"]):
        doc["_id"] = f"{queue}/malformed/{str(doc['_id']).rsplit('/', 1)[-1]}"
    if queue is not None:
        doc["queue"] = queue
    if body is not None:
        doc["body"] = body
    return doc


class MongoDeadLetters:
    """Dead letters of the dispatcher (``origin: "dispatch"``) and of consumers
    (``origin: "consume"``, with ``queue`` and the raw ``body``), in one collection."""

    def __init__(self, collection: Any) -> None:
        self.collection = collection

    def put(
        self,
        aggregate_id: AggregateId | None,
        entry: dict[str, Any],
        error: str,
        attempts: int,
        *,
        origin: str = "dispatch",
        queue: str | None = None,
        body: str | bytes | None = None,
    ) -> None:
        doc = consumer_dead_letter(aggregate_id, entry, error, attempts, origin, queue, body)
        with translated(aggregate_id):
            try:
                self.collection.insert_one(doc)
            except DuplicateKeyError:
                return  # already quarantined

    def ensure_indexes(self) -> None:
        """Create :data:`DEAD_LETTER_INDEXES` (idempotent)."""
        with translated():
            for name, keys, options in DEAD_LETTER_INDEXES:
                self.collection.create_index(keys, name=name, **options)

    def refers_to(self, payload_id: str) -> bool:
        """Whether a dead letter holds a claim-checked entry with that payload (the
        orphan sweep keeps the payload then)."""
        with translated():
            return self.collection.find_one(claimed(payload_id), {"_id": 1}) is not None


def claimed(payload_id: str) -> dict[str, Any]:
    """The dead letters holding a claim-checked entry with that payload."""
    return {"entry.claim.id": payload_id}


class AsyncMongoCheckpoints(MongoCheckpoints):
    """The async twin of :class:`MongoCheckpoints` (pymongo async or Motor)."""

    async def load(self, name: str) -> Position | None:
        with translated():
            doc = await self.collection.find_one({"_id": name})
        return None if doc is None else doc.get("token")

    async def save(self, name: str, position: Position) -> None:  # type: ignore[override]
        with translated():
            await self.collection.update_one(
                {"_id": name}, {"$set": {"token": position, "updated_at": utcnow()}}, upsert=True
            )


class AsyncMongoDeadLetters(MongoDeadLetters):
    """The async twin of :class:`MongoDeadLetters` (pymongo async or Motor)."""

    async def put(  # type: ignore[override]
        self,
        aggregate_id: AggregateId | None,
        entry: dict[str, Any],
        error: str,
        attempts: int,
        *,
        origin: str = "dispatch",
        queue: str | None = None,
        body: str | bytes | None = None,
    ) -> None:
        doc = consumer_dead_letter(aggregate_id, entry, error, attempts, origin, queue, body)
        with translated(aggregate_id):
            try:
                await self.collection.insert_one(doc)
            except DuplicateKeyError:
                return  # already quarantined

    async def ensure_indexes(self) -> None:  # type: ignore[override]
        with translated():
            for name, keys, options in DEAD_LETTER_INDEXES:
                await self.collection.create_index(keys, name=name, **options)

    async def refers_to(self, payload_id: str) -> bool:  # type: ignore[override]
        with translated():
            return await self.collection.find_one(claimed(payload_id), {"_id": 1}) is not None
