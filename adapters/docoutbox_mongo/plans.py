"""Pure translation of docoutbox write plans into MongoDB filters and update documents."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from docoutbox.model import AggregateId
from docoutbox.store.plans import CommitPlan, FailurePlan, TrimPlan

Filter = dict[str, Any]
Update = dict[str, Any]

#: Indexes the store's queries use: (name, keys).
INDEXES: tuple[tuple[str, list[tuple[str, int]]], ...] = (
    ("docoutbox_pending_age", [("outbox.created_at", 1)]),
    ("docoutbox_partition", [("partition", 1), ("_id", 1)]),
)

#: The partial index of the pending-work query: only documents with pending entries are
#: in it, so it holds as many keys as documents wait, whatever the collection's size.
PENDING_PARTITION_INDEX = "docoutbox_pending_partition"
PENDING_PARTITION_KEYS = [("partition", 1)]
PENDING_PARTITION_FILTER: Filter = {"outbox.0": {"$exists": True}}


def commit_update(plan: CommitPlan) -> tuple[Filter, Update]:
    """One conditional update: guarded by ``version``; appends, never replaces, the outbox."""
    update: Update = {
        "$set": {
            "state": plan.state,
            "outbox_seq": plan.outbox_seq,
            "updated_at": plan.updated_at,
        },
        "$inc": {"version": 1},
    }
    push: dict[str, Any] = {}
    if plan.outbox_push:
        push["outbox"] = {"$each": list(plan.outbox_push)}
    if plan.inbox_push:
        push["inbox"] = {"$each": list(plan.inbox_push), "$slice": -plan.inbox_window}
    if push:
        update["$push"] = push
    if plan.inbox_marks is not None:
        update["$set"]["inbox_marks"] = list(plan.inbox_marks)
    if plan.state_version is not None:
        update["$set"]["state_version"] = plan.state_version
    return {"_id": plan.aggregate_id, "version": plan.expected_version}, update


def trim_update(plan: TrimPlan) -> tuple[Filter, Update]:
    """Pull published entries by ID. No version filter, no version change."""
    return (
        {"_id": plan.aggregate_id},
        {"$pull": {"outbox": {"id": {"$in": list(plan.entry_ids)}}}},
    )


def failure_update(plan: FailurePlan) -> tuple[Filter, Update]:
    """Record a failed publish on the entry, by position. No version filter or change."""
    return (
        {"_id": plan.aggregate_id, "outbox.id": plan.entry_id},
        {"$set": {"outbox.$.attempts": plan.attempts, "outbox.$.last_error": plan.last_error}},
    )


def pending_filter(
    after: AggregateId | None,
    older_than: datetime | None,
    partitions: Collection[int] | None,
) -> Filter:
    """Documents with pending entries, after ``after`` in MongoDB's ``_id`` order."""
    clauses: list[Filter] = [{"outbox.0": {"$exists": True}}]
    if isinstance(after, int):
        # Numbers sort before strings, and $gt only compares within one type.
        clauses.append({"$or": [{"_id": {"$gt": after}}, {"_id": {"$type": "string"}}]})
    elif after is not None:
        clauses.append({"_id": {"$gt": after}})
    if older_than is not None:
        clauses.append({"outbox": {"$elemMatch": {"created_at": {"$lt": older_than}}}})
    if partitions is not None:
        clauses.append({"partition": {"$in": sorted(partitions)}})
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}
