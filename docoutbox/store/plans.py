"""Pure write plans. Adapters translate them into one conditional single-document write.

- :class:`InsertPlan`: create a document; an existing ``_id`` means "not applied".
- :class:`CommitPlan`: state + version + inbox + new outbox entries, applied only if the
  stored ``version`` still equals ``expected_version``. Entries are *appended*, never set,
  so a commit cannot drop an entry it did not publish.
- :class:`TrimPlan`: remove published entries by ID. It does not touch ``version``, so it
  never conflicts with a business write.

:func:`apply_plan` is the reference semantics every store must match; the in-memory store
and the size guard use it directly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from docoutbox.errors import DocumentTooLarge
from docoutbox.handlers import Decision
from docoutbox.model import AggregateId, Emit, InboxPolicy, Message
from docoutbox.store.document import ID, Document, Snapshot, fast_frozen
from docoutbox.store.inbox import Mark, record_mark, uses_marks

DETERMINISTIC_NAMESPACE = uuid.UUID("5b0a3c1e-7d2f-4c52-9a43-0d6f0c1b8e21")


@dataclass(frozen=True)
class InsertPlan:
    aggregate_id: AggregateId
    document: Document


@dataclass(frozen=True)
class CommitPlan:
    aggregate_id: AggregateId
    expected_version: int
    #: In stored form: a JSON object, or an encoded string (:mod:`docoutbox.stored`).
    state: Any
    outbox_push: tuple[dict[str, Any], ...]
    outbox_seq: int
    inbox_push: tuple[str, ...]
    inbox_window: int
    #: The whole inbox after the commit (when it changes), for stores that cannot append
    #: and slice in one operation. Safe to set: only version-guarded commits change it.
    inbox_after: tuple[str, ...] | None
    inbox_marks: tuple[dict[str, Any], ...] | None
    updated_at: datetime
    #: The model version of ``state`` to store as ``state_version`` (None: not versioned).
    state_version: int | None = None


@dataclass(frozen=True)
class TrimPlan:
    """Remove the entries ``entry_ids`` from the outbox. Never touches ``version``.

    ``outbox`` and ``revision`` are hints, not part of the plan: the entry IDs of the
    whole outbox in stored order as the trimmer last saw it (None for an entry without an
    ID), and the store's tag of that copy, if known. A store that removes entries by
    position (Cosmos DB) may aim its first attempt at those positions, guarded by the
    revision or by the IDs found there, and read only when the guard fails.
    """

    aggregate_id: AggregateId
    entry_ids: tuple[str, ...]
    outbox: tuple[str | None, ...] | None = field(default=None, compare=False)
    revision: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class FailurePlan:
    """Record a failed publish on one pending entry. Never touches ``version``."""

    aggregate_id: AggregateId
    entry_id: str
    attempts: int
    last_error: str


WritePlan = InsertPlan | CommitPlan | TrimPlan | FailurePlan


def entry_id(aggregate_type: str, aggregate_id: AggregateId, seq: int) -> str:
    """The deterministic ID of the entry numbered ``seq`` of an aggregate."""
    return str(uuid.uuid5(DETERMINISTIC_NAMESPACE, f"{aggregate_type}/{aggregate_id}/{seq}"))


def seal(
    emits: Sequence[Emit],
    *,
    aggregate_id: AggregateId,
    aggregate_type: str,
    last_seq: int,
    cause: Message,
    now: datetime,
    deterministic_ids: bool,
) -> list[dict[str, Any]]:
    """Number and stamp a handler's emits as stored outbox entries, seq ``last_seq + 1`` on.

    Every input is already validated (the emits, the cause, the aggregate ID), so the
    entries are built directly in their stored form; :class:`OutboxMessage` reads them.
    """
    sealed = []
    for offset, item in enumerate(emits, start=1):
        seq = last_seq + offset
        if item.id is not None:
            message_id = item.id
        elif deterministic_ids:
            message_id = entry_id(aggregate_type, aggregate_id, seq)
        else:
            message_id = str(uuid.uuid4())
        sealed.append(
            {
                "id": message_id,
                "type": item.type,
                "payload": item.payload,
                "headers": dict(item.headers),
                "created_at": now,
                "seq": seq,
                "aggregate_id": aggregate_id,
                "aggregate_type": aggregate_type,
                "correlation_id": cause.correlation_id or cause.id,
                "causation_id": cause.id,
                "destination": item.destination,
                "attempts": 0,
                "last_error": None,
            }
        )
    return sealed


def plan_commit(
    snapshot: Snapshot[Any],
    message: Message,
    decision: Decision[Any],
    *,
    policy: InboxPolicy,
    now: datetime,
    deterministic_ids: bool,
    state: dict[str, Any] | None = None,
) -> tuple[CommitPlan, list[dict[str, Any]]]:
    """The conditional write that records ``decision`` as the handling of ``message``.

    ``state`` is the decision's state in stored form when the caller has it already (the
    store checks it reads back); by default it is dumped here.
    """
    entries = seal(
        decision.emits,
        aggregate_id=snapshot.aggregate_id,
        aggregate_type=snapshot.aggregate_type,
        last_seq=snapshot.outbox_seq,
        cause=message,
        now=now,
        deterministic_ids=deterministic_ids,
    )
    marks = None
    inbox_push: tuple[str, ...] = ()
    inbox_after = None
    if uses_marks(policy, message):
        marks = marks_to_doc(record_mark(policy, snapshot.marks, message))
    elif policy.window:
        inbox_push = (message.id,)
        inbox_after = appended(snapshot.inbox, message.id, policy.window)
    plan = fast_frozen(
        CommitPlan,
        aggregate_id=snapshot.aggregate_id,
        expected_version=snapshot.version,
        state=decision.state.model_dump(mode="json") if state is None else state,
        outbox_push=tuple(entries),
        outbox_seq=snapshot.outbox_seq + len(entries),
        inbox_push=inbox_push,
        inbox_window=policy.window,
        inbox_after=inbox_after,
        inbox_marks=marks,
        updated_at=now,
    )
    return plan, entries


def appended(inbox: tuple[str, ...], message_id: str, window: int) -> tuple[str, ...]:
    """``(*inbox, message_id)[-window:]`` for ``window`` > 0, in one slice and one
    concatenation instead of a list, a tuple and a slice."""
    start = len(inbox) + 1 - window
    return (inbox[start:] if start > 0 else inbox) + (message_id,)


def plan_trim(
    aggregate_id: AggregateId,
    entry_ids: Sequence[str],
    outbox: Sequence[str | None] | None = None,
    revision: str | None = None,
) -> TrimPlan:
    """``outbox``, ``revision``: hints of where the entries are (see :class:`TrimPlan`)."""
    hint = None if outbox is None else tuple(outbox)
    return TrimPlan(aggregate_id, tuple(dict.fromkeys(entry_ids)), hint, revision)


def apply_plan(doc: Document | None, plan: WritePlan) -> Document | None:
    """The document after ``plan``, or None when the plan would not apply to ``doc``."""
    if isinstance(plan, InsertPlan):
        return None if doc is not None else dict(plan.document)
    if doc is None:
        return None
    if isinstance(plan, TrimPlan):
        drop = set(plan.entry_ids)
        return {**doc, "outbox": [e for e in doc.get("outbox", ()) if e.get("id") not in drop]}
    if isinstance(plan, FailurePlan):
        outbox = list(doc.get("outbox", ()))
        for index, entry in enumerate(outbox):
            if entry.get("id") == plan.entry_id:
                outbox[index] = {**entry, "attempts": plan.attempts, "last_error": plan.last_error}
                return {**doc, "outbox": outbox}
        return None
    if doc.get("version") != plan.expected_version:
        return None
    after = {
        **doc,
        "state": plan.state,
        "version": plan.expected_version + 1,
        "outbox": [*doc.get("outbox", ()), *plan.outbox_push],
        "outbox_seq": plan.outbox_seq,
        "updated_at": plan.updated_at,
    }
    if plan.inbox_push:
        after["inbox"] = kept_window(doc.get("inbox", ()), plan.inbox_push, plan.inbox_window)
    if plan.inbox_marks is not None:
        after["inbox_marks"] = list(plan.inbox_marks)
    if plan.state_version is not None:
        after["state_version"] = plan.state_version
    return after


def kept_window(items: Sequence[Any], push: Sequence[Any], window: int) -> list[Any]:
    """``[*items, *push][-window:]``, copying each kept item once instead of three times
    (the inbox is most of what a commit touches)."""
    keep = window - len(push)
    if window <= 0 or keep <= 0:
        return [*items, *push][-window:]
    kept = items[-keep:] if type(items) is list else list(items[-keep:])
    kept.extend(push)
    return kept


def marks_to_doc(marks: Sequence[Mark]) -> tuple[dict[str, Any], ...]:
    return tuple(mark.to_doc() for mark in marks)


def guard_size(
    doc: Document, aggregate_id: AggregateId, size_of: Callable[[Document], int], limit: int
) -> None:
    """Raise DocumentTooLarge, naming the aggregate and the sizes, before a write."""
    size = size_of(doc)
    if size > limit:
        raise DocumentTooLarge(aggregate_id, size, limit)


__all__ = [
    "ID",
    "CommitPlan",
    "FailurePlan",
    "InsertPlan",
    "TrimPlan",
    "WritePlan",
    "apply_plan",
    "entry_id",
    "guard_size",
    "plan_commit",
    "plan_trim",
    "seal",
]
