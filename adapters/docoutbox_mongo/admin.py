"""Operating the outbox on MongoDB: backlog figures, pending work per partition, dead
letters, leases.

Pending work (:func:`pending_work`) is one aggregation grouped by the stored
``partition``: it matches ``{"outbox.0": {"$exists": true}}`` and sorts on
``partition``, which the partial index ``docoutbox_pending_partition`` (``{partition:
1}``, ``partialFilterExpression: {"outbox.0": {"$exists": true}}``, made by
``ensure_indexes``) serves; that index holds one key per document with pending entries,
so a scrape reads as many index keys and documents as wait (not the collection), and
returns one row per partition.

Used by the ``docoutbox outbox``, ``docoutbox dead-letters`` and ``docoutbox leases``
commands, and usable directly. Dead letters are listed, replayed and purged as
:mod:`docoutbox.dispatch.tools.replay` says, here over a collection.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING

from docoutbox.dispatch.engine import lag
from docoutbox.dispatch.engine.backlog import OutboxStats, summarize
from docoutbox.dispatch.tools import replay
from docoutbox.dispatch.tools.lease_rows import LeaseRow
from docoutbox.dispatch.tools.lease_rows import lease_rows as rows_of
from docoutbox.dispatch.tools.replay import GONE
from docoutbox.model import AggregateId
from docoutbox.store.document import utcnow
from docoutbox_mongo.errors import translated

PENDING = {"outbox.0": {"$exists": True}}
STATS_PROJECTION = {"_id": 1, "partition": 1, "outbox.type": 1, "outbox.created_at": 1}


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def outbox_stats(collection: Any, now: datetime | None = None) -> OutboxStats:
    """The backlog of ``collection``, read through a projection of the pending documents."""
    with translated():
        docs = list(collection.find(PENDING, STATS_PROJECTION))
    return summarize(docs, now)


#: Pending entries, aggregates and the oldest entry per stored partition.
PENDING_WORK: list[dict[str, Any]] = [
    {"$match": PENDING},
    {"$sort": {"partition": 1}},
    {
        "$project": {
            "_id": 0,
            "partition": 1,
            "n": {"$size": "$outbox"},
            "oldest": {"$min": "$outbox.created_at"},
        }
    },
    {
        "$group": {
            "_id": "$partition",
            "entries": {"$sum": "$n"},
            "aggregates": {"$sum": 1},
            "oldest": {"$min": "$oldest"},
        }
    },
]


def pending_work(
    collection: Any, partitions: int | None = None, now: datetime | None = None
) -> lag.PendingWork:
    """The pending work of ``collection`` per stored partition, in one aggregation (see
    the module doc); ``partitions``, when given, adds the idle ones as zeros."""
    with translated():
        rows = list(collection.aggregate(PENDING_WORK))
    return lag.pending_work(
        [lag.Row(r["_id"], r["entries"], r["aggregates"], _aware(r.get("oldest"))) for r in rows],
        unit=lag.PARTITION,
        partitions=partitions,
        now=now,
    )


class MongoDeadLetterStore:
    """The dead letters of one collection, and the aggregates' collection to replay into
    (see :mod:`docoutbox.dispatch.tools.replay`)."""

    def __init__(self, dead_letters: Any, aggregates: Any | None = None) -> None:
        self.dead_letters = dead_letters
        self.collection = aggregates
        self.aggregates = None if aggregates is None else str(aggregates.name)

    def listing(self, limit: int) -> list[dict[str, Any]]:
        with translated():
            cursor = self.dead_letters.find({}).sort([("quarantined_at", ASCENDING)])
            return list(cursor.limit(limit)) if limit else list(cursor)

    def count(self) -> int:
        with translated():
            return int(self.dead_letters.count_documents({}))

    def find(self, dead_letter_id: str) -> dict[str, Any] | None:
        with translated():
            doc = self.dead_letters.find_one({"_id": dead_letter_id})
        return None if doc is None else dict(doc)

    def delete(self, ids: Sequence[str] | None) -> int:
        query: dict[str, Any] = {} if ids is None else {"_id": {"$in": list(ids)}}
        with translated():
            return int(self.dead_letters.delete_many(query).deleted_count)

    def aggregate_type(self, aggregate_id: AggregateId) -> object:
        assert self.collection is not None
        with translated(aggregate_id):
            doc = self.collection.find_one({"_id": aggregate_id}, {"type": 1})
        return GONE if doc is None else doc.get("type")

    def append(self, aggregate_id: AggregateId, entry: dict[str, Any]) -> bool:
        assert self.collection is not None
        with translated(aggregate_id):
            result = self.collection.update_one(
                {"_id": aggregate_id, "outbox.seq": {"$ne": entry["seq"]}},
                {"$push": {"outbox": entry}},
            )
        return bool(result.modified_count)


class DeadLetterAdmin(replay.DeadLetterAdmin):
    """List, show, replay and purge the dead letters of one database."""

    def __init__(
        self, dead_letters: Any, aggregates: Any | None = None, values: Any | None = None
    ) -> None:
        super().__init__(MongoDeadLetterStore(dead_letters, aggregates), values)


def lease_rows(
    collection: Any, group: str | None = None, now: datetime | None = None
) -> list[LeaseRow]:
    """Every lease and member heartbeat (of ``group``, or of all groups), partition order."""
    query: dict[str, Any] = {} if group is None else {"group": group}
    with translated():
        docs = list(collection.find(query))
    return rows_of(docs, now or utcnow(), _aware)


def claim_ports(database: Any, collection: str, dead_letters: str) -> tuple[Any, Any, Any]:
    """The store backend of ``collection``, the payload store beside it and the dead
    letters (for the orphan sweep of the claim check), with the indexes the sweep's
    queries use (created when missing)."""
    from docoutbox_mongo.backend import MongoBackend  # noqa: PLC0415
    from docoutbox_mongo.coordination import MongoDeadLetters  # noqa: PLC0415
    from docoutbox_mongo.payloads import MongoPayloads, payloads_collection  # noqa: PLC0415

    payloads = MongoPayloads(database[payloads_collection(collection)])
    letters = MongoDeadLetters(database[dead_letters])
    payloads.ensure_indexes()
    letters.ensure_indexes()
    return MongoBackend(database[collection]), payloads, letters
