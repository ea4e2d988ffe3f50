"""Pure translation of docoutbox write plans into MongoDB filters and update documents."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from docoutbox.model import AggregateId
from docoutbox.store.plans import CommitPlan, FailurePlan, ReleasePlan, SettlePlan, TrimPlan
from docoutbox.store.schedule import CANCELLED, DUE, EARLIEST_DUE, RELEASED

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

#: The partial index of the due query: only documents with pending scheduled entries
#: carry ``earliest_due``, so it holds as many keys as such documents.
DUE_INDEX = "docoutbox_due"
DUE_KEYS = [(EARLIEST_DUE, 1)]
DUE_FILTER: Filter = {EARLIEST_DUE: {"$exists": True}}


#: An entry that may be released or cancelled: ``released`` absent or ``false``; and its
#: complement, released (``true``) or malformed (any other value, null included), as
#: :func:`~docoutbox.store.schedule.release_open` tells them apart. ``$ne: false``
#: compares types, so a stored 0 or 1 is not ``false``.
_OPEN: Filter = {"$or": [{RELEASED: {"$exists": False}}, {RELEASED: False}]}
_CLOSED: Filter = {RELEASED: {"$exists": True, "$ne": False}}


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
    if plan.inbox_spill is not None:
        # A spill: the IDs that leave are in the archive already (docoutbox.store.spill).
        update["$set"]["inbox"] = list(plan.inbox_after or ())
        update["$set"]["inbox_spill"] = plan.inbox_spill
    elif plan.inbox_push:
        push["inbox"] = {"$each": list(plan.inbox_push), "$slice": -plan.inbox_window}
    if push:
        update["$push"] = push
    if plan.inbox_marks is not None:
        update["$set"]["inbox_marks"] = list(plan.inbox_marks)
    if plan.state_version is not None:
        update["$set"]["state_version"] = plan.state_version
    query: Filter = {"_id": plan.aggregate_id, "version": plan.expected_version}
    if plan.cancel_ids:
        # Each cancelled entry must still be pending and open (schedule.py).
        query["$and"] = [
            {"outbox": {"$elemMatch": {"id": entry_id, **_OPEN}}} for entry_id in plan.cancel_ids
        ]
        push[CANCELLED] = {"$each": list(plan.cancel_ids)}
        update["$push"] = push
    if plan.sets_due:
        if plan.earliest_due is None:
            update["$unset"] = {EARLIEST_DUE: ""}
        else:
            update["$set"][EARLIEST_DUE] = plan.earliest_due
    return query, update


def trim_update(plan: TrimPlan) -> tuple[Filter, Update]:
    """Pull published (or cancelled) entries by ID, and their IDs from ``cancelled``.
    No version filter, no version change.

    The filter is the ``_id`` alone, which every server answers from its index. On a
    document whose ``cancelled`` is not an array (malformed), MongoDB refuses the whole
    update (``$pull`` on a value that is not an array, code :data:`PULL_REFUSED`); the
    store then writes :func:`trim_outbox_update` instead."""
    ids = list(plan.entry_ids)
    return (
        {"_id": plan.aggregate_id},
        {"$pull": {"outbox": {"id": {"$in": ids}}, CANCELLED: {"$in": ids}}},
    )


#: MongoDB's code (BadValue) for an update refused as a whole, e.g. a ``$pull`` on a
#: field that is not an array.
PULL_REFUSED = 2


def trim_outbox_update(plan: TrimPlan) -> tuple[Filter, Update]:
    """The trim of a document whose ``cancelled`` cannot be pulled from: the entries
    leave the outbox, and ``cancelled`` stays as it is, as
    :func:`~docoutbox.store.plans.apply_plan` trims a malformed one."""
    return (
        {"_id": plan.aggregate_id},
        {"$pull": {"outbox": {"id": {"$in": list(plan.entry_ids)}}}},
    )


def release_update(plan: ReleasePlan) -> tuple[Filter, Update]:
    """Release and number a due entry, unless it was cancelled, or ``outbox_seq`` moved:
    ``seq = outbox_seq + 1``, and ``version`` incremented (a commit read before conflicts).

    The entry itself must be open, neither released nor malformed (``outbox_seq`` alone
    would let a release renumber one whose document's counter still matches), and
    ``cancelled`` must be absent, null, or an array not naming it: any other value is
    malformed and refuses the release, as :func:`~docoutbox.store.plans.apply_plan`
    does. The positional ``$`` is the entry ``outbox.id`` matched; the released guard is
    a negated ``$elemMatch``, which sets no position (the wire server cannot update the
    position of a positive one)."""
    seq = plan.outbox_seq + 1
    query: Filter = {
        "_id": plan.aggregate_id,
        "outbox_seq": plan.outbox_seq,
        "outbox.id": plan.entry_id,
        "outbox": {"$not": {"$elemMatch": {"id": plan.entry_id, **_CLOSED}}},
        "$or": [{CANCELLED: None}, {CANCELLED: {"$type": "array", "$ne": plan.entry_id}}],
    }
    update: Update = {
        "$set": {"outbox.$.seq": seq, f"outbox.$.{RELEASED}": True, "outbox_seq": seq},
        "$inc": {"version": 1},
    }
    return query, update


def settle_update(plan: SettlePlan) -> tuple[Filter, Update]:
    """Set (or remove) the due-time hint, if no commit (so no entry) came since ``version``."""
    query = {"_id": plan.aggregate_id, "version": plan.version}
    if plan.earliest_due is None:
        return query, {"$unset": {EARLIEST_DUE: ""}}
    return query, {"$set": {EARLIEST_DUE: plan.earliest_due}}


def due_filter(
    due_before: datetime, after: AggregateId | None, partitions: Collection[int] | None
) -> Filter:
    """Documents whose due-time hint is at or before ``due_before``, after ``after``."""
    clauses: list[Filter] = [{EARLIEST_DUE: {"$lte": due_before}}]
    clauses.extend(_after(after))
    if partitions is not None:
        clauses.append({"partition": {"$in": sorted(partitions)}})
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _after(after: AggregateId | None) -> list[Filter]:
    if isinstance(after, int):
        # Numbers sort before strings, and $gt only compares within one type.
        return [{"$or": [{"_id": {"$gt": after}}, {"_id": {"$type": "string"}}]}]
    if after is not None:
        return [{"_id": {"$gt": after}}]
    return []


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
        # A scheduled entry counts from its due time (the due query finds it before).
        aged = {
            "created_at": {"$lt": older_than},
            "$or": [{DUE: {"$exists": False}}, {DUE: {"$lt": older_than}}],
        }
        clauses.append({"outbox": {"$elemMatch": aged}})
    if partitions is not None:
        clauses.append({"partition": {"$in": sorted(partitions)}})
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}
