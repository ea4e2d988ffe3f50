"""What the Cosmos store does, as sans-IO flows shared by the sync and async backends.

A flow yields requests (:class:`Read`, :class:`Create`, :class:`Patch`, :class:`Replace`,
:class:`Query`) and receives their answers; :mod:`docoutbox_cosmos.backend` drives it
against ``azure.cosmos`` or ``azure.cosmos.aio``. Expected refusals (404, 409, 412) come
back as a :class:`~docoutbox_cosmos.errors.Refusal`; every other failure is raised by the
driver, translated.

Rules kept here:

- a commit is ONE conditional write: a patch guarded by ``version`` (at most 10 ops), or,
  when the commit needs more ops, a replace guarded by the ETag of a fresh read whose
  ``version`` still matches; a 412 caused by a trim or a failure record (which change the
  ETag, never ``version``) re-reads and replaces again, so a trim never fails a commit;
- a trim removes entries by index, guarded by the IDs at those indexes; it never touches
  ``version``; when another writer moved them (412) it re-reads and tries again. Its
  first attempt aims at the positions the plan's outbox hint gives (the dispatcher
  publishes from the change feed's copy of the item), else at the outbox remembered from
  the item's last read or write, so a trim is usually one request; a concurrent commit
  only appends, so it never moves the positions aimed at, and its entries are never
  named by the guard;
- a failure record sets two fields of one entry, guarded the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from docoutbox.errors import TransientStoreError
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
    apply_plan,
)
from docoutbox_cosmos.errors import Refusal
from docoutbox_cosmos.items import (
    Item,
    ItemCodec,
    PatchOps,
    commit_patch,
    due_queries,
    failure_patch,
    pending_queries,
    trim_patches,
)

#: How many times a trim, failure record or large commit re-reads after losing a race.
MAX_RACES = 100
#: The key marking an item answered from memory (:class:`Recall`).
RECALLED = "__recalled__"


@dataclass(frozen=True)
class Read:
    item_id: str
    partition_key: str


@dataclass(frozen=True)
class Recall:
    """Like :class:`Read`, but answered from the backend's memory of the item's outbox
    (entry IDs only, from its last read or write) when it has one."""

    item_id: str
    partition_key: str


@dataclass(frozen=True)
class Create:
    item: Item


@dataclass(frozen=True)
class Patch:
    """A patch guarded by a filter ``predicate``, or by ``etag`` (if-match) when set."""

    item_id: str
    partition_key: str
    ops: PatchOps
    predicate: str | None
    etag: str | None = None


@dataclass(frozen=True)
class Replace:
    item: Item
    partition_key: str
    etag: str


@dataclass(frozen=True)
class Query:
    sql: str
    parameters: list[dict[str, Any]]


Request = Read | Recall | Create | Patch | Replace | Query
#: Answers: Read, Recall -> Item | None; Create, Patch, Replace -> Item | Refusal;
#: Query -> list. A recalled item has ``RECALLED`` set and only its ``outbox`` IDs.
Flow = Generator[Request, Any, Any]


def load(codec: ItemCodec, aggregate_id: AggregateId) -> Flow:
    item_id, pk = codec.key(aggregate_id)
    item = yield Read(item_id, pk)
    return None if item is None else codec.to_document(item)


def write(codec: ItemCodec, plan: WritePlan) -> Flow:
    """Execute ``plan``; return whether it applied."""
    if isinstance(plan, InsertPlan):
        answer = yield Create(codec.to_item(plan.document))
        return not isinstance(answer, Refusal)
    item_id, pk = codec.key(plan.aggregate_id)
    if isinstance(plan, CommitPlan):
        # A commit that cancels or moves the due-time hint replaces the item.
        patch = None if plan.cancel_ids or plan.sets_due else commit_patch(plan)
        if patch is not None:
            answer = yield Patch(item_id, pk, *patch)
            return not isinstance(answer, Refusal)
    if isinstance(plan, TrimPlan) and plan.revision is not None and plan.outbox is not None:
        done = yield from _trim_unchanged(plan, item_id, pk, plan.revision, plan.outbox)
        if done is not None:
            return done
    # A trim or failure record first trusts the remembered outbox; a release or settle
    # reads the item and replaces it guarded by its ETag, like a large commit.
    recall = isinstance(plan, TrimPlan | FailurePlan)
    for _ in range(MAX_RACES):
        if recall and isinstance(plan, TrimPlan) and plan.outbox is not None:
            item = hinted(plan.outbox)  # the positions the dispatcher saw: no request
        else:
            item = yield (Recall(item_id, pk) if recall else Read(item_id, pk))
        recall = False
        if item is None:
            return False
        outcome = yield from _conditional(codec, plan, item, item_id, pk)
        if outcome is not None:
            return outcome
    raise TransientStoreError(
        f"aggregate {plan.aggregate_id!r}: lost {MAX_RACES} races in a row; try again"
    )


def hinted(outbox: tuple[str | None, ...]) -> Item:
    """A recalled item built from a trim plan's outbox hint (entry IDs in stored order)."""
    return {"outbox": [{"id": entry_id} for entry_id in outbox], RECALLED: True}


def _trim_unchanged(
    plan: TrimPlan, item_id: str, pk: str, etag: str, outbox: tuple[str | None, ...]
) -> Generator[Request, Any, bool | None]:
    """Trim at the positions of a copy whose ETag is known, guarded by that ETag (if-match):
    True/False when decided, None when the item changed since (then guard by the IDs).

    An unchanged item is exactly the copy, so its positions are right; a concurrent commit
    changes the ETag, and its 412 sends the trim to the ID-guarded patches. Each patch's
    answer carries the ETag for the next ten entries.
    """
    if not set(outbox) >= set(plan.entry_ids):
        return None
    next_etag: Any = etag
    for ops, predicate in trim_patches(hinted(outbox)["outbox"], plan.entry_ids):
        # Without an ETag to chain on, the IDs guard the rest: the patches before removed
        # only higher positions, and commits only append.
        guard = next_etag if isinstance(next_etag, str) and next_etag else None
        answer = yield Patch(item_id, pk, ops, None if guard else predicate, guard)
        if answer is Refusal.MISSING:
            return False
        if isinstance(answer, Refusal):
            return None
        next_etag = answer.get("_etag") if isinstance(answer, dict) else None
    return True


def _conditional(
    codec: ItemCodec,
    plan: CommitPlan | TrimPlan | FailurePlan | ReleasePlan | SettlePlan,
    item: Item,
    item_id: str,
    pk: str,
) -> Generator[Request, Any, bool | None]:
    """One attempt from a fresh read: True/False when decided, None to re-read."""
    outbox = item.get("outbox") or []
    known = {e.get("id") for e in outbox if isinstance(e, dict)}
    if item.get(RECALLED) and isinstance(plan, TrimPlan) and not known >= set(plan.entry_ids):
        return None  # the memory may predate those entries: read before concluding
    if isinstance(plan, TrimPlan):
        for ops, predicate in trim_patches(outbox, plan.entry_ids):
            answer = yield Patch(item_id, pk, ops, predicate)
            if answer is Refusal.MISSING:
                return False
            if answer is Refusal.STALE:
                return None
        return True
    if isinstance(plan, FailurePlan):
        patch = failure_patch(outbox, plan)
        if patch is None:
            return False
        answer = yield Patch(item_id, pk, *patch)
        return None if answer is Refusal.STALE else answer is not Refusal.MISSING
    doc: Document = codec.to_document(item)
    after = apply_plan(doc, plan)
    if after is None:
        return False  # the version moved on: a real conflict
    answer = yield Replace(codec.to_item(after), pk, item["_etag"])
    return None if answer is Refusal.STALE else answer is not Refusal.MISSING


def find_pending(
    codec: ItemCodec,
    after: AggregateId | None,
    limit: int,
    older_than: datetime | None,
    partitions: Collection[int] | None,
) -> Flow:
    return (yield from _paged(codec, limit, pending_queries(after, limit, older_than, partitions)))


def find_due(
    codec: ItemCodec,
    due_before: datetime,
    after: AggregateId | None,
    limit: int,
    partitions: Collection[int] | None,
) -> Flow:
    return (yield from _paged(codec, limit, due_queries(due_before, after, limit, partitions)))


def _paged(codec: ItemCodec, limit: int, queries: list[tuple[str, Any]]) -> Flow:
    docs: list[Document] = []
    if limit <= 0:
        return docs
    for sql, parameters in queries:
        params = [
            {"name": "@limit", "value": limit - len(docs)} if p["name"] == "@limit" else p
            for p in parameters
        ]
        items = yield Query(sql, params)
        for item in items:
            docs.append(codec.to_document(item))
            if isinstance(item, dict):
                item.clear()  # the SDK's pager keeps its last page until a cyclic GC
        if len(docs) >= limit:
            break
    return docs[:limit]
