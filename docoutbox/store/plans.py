"""Pure write plans. Adapters translate them into one conditional single-document write.

- :class:`InsertPlan`: create a document; an existing ``_id`` means "not applied".
- :class:`CommitPlan`: state + version + inbox + new outbox entries, applied only if the
  stored ``version`` still equals ``expected_version``. Entries are *appended*, never set,
  so a commit cannot drop an entry it did not publish.
- :class:`TrimPlan`: remove published entries by ID. It does not touch ``version``, so it
  never conflicts with a business write.
- :class:`ReleasePlan` and :class:`SettlePlan`: the dispatcher's writes for scheduled
  entries (see :mod:`docoutbox.store.schedule`). A release numbers the entry and
  increments ``version`` (so a business commit read before it conflicts); a settle is
  guarded by ``version`` and does not change it.

:func:`apply_plan` is the reference semantics every store must match; the in-memory store
and the size guard use it directly. Its guards compare stored counters (``version``,
``outbox_seq``) as the databases' filters do: by numeric value, a boolean never.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from docoutbox.errors import DocumentTooLarge, InvalidHandlerResult
from docoutbox.handlers import Decision
from docoutbox.model import AggregateId, Emit, InboxPolicy, Message
from docoutbox.store.document import ID, Document, Snapshot
from docoutbox.store.inbox import Mark, record_mark
from docoutbox.store.schedule import (
    CANCELLED,
    DUE,
    EARLIEST_DUE,
    KEY,
    RELEASED,
    cancellable,
    ceil_millis,
    earliest_due,
    release_open,
)

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
    #: Scheduled entries this commit cancels: each must still be pending and not released
    #: when it applies (else the commit does not apply), and joins ``cancelled``.
    cancel_ids: tuple[str, ...] = ()
    #: Whether the commit sets ``earliest_due`` (to ``earliest_due``; None: removes it).
    #: False leaves the field alone: the document had no scheduled entry.
    sets_due: bool = False
    earliest_due: datetime | None = None
    #: Inbox IDs this commit moves to the inbox archive (:mod:`docoutbox.store.spill`),
    #: written there before the commit; ``inbox_after`` is then the inbox without them.
    inbox_spilled: tuple[str, ...] = ()
    #: The document's ``inbox_spill`` field after the commit (None: unchanged).
    inbox_spill: dict[str, Any] | None = None


@dataclass(frozen=True)
class TrimPlan:
    """Remove the entries ``entry_ids`` from the outbox. Never touches ``version``.

    ``outbox`` and ``revision`` are hints, not part of the plan: the entry IDs of the
    whole outbox in stored order as the trimmer last saw it (None for an entry without an
    ID), and the store's tag of that copy, if known. A store that removes entries by
    position (Cosmos DB) may aim its first attempt at those positions, guarded by the
    revision or by the IDs found there, and read only when the guard fails.

    ``payloads`` is a hint for the dispatcher, not the store: some of the entries are
    claim-checked, and their payloads are deleted once this trim commits.
    """

    aggregate_id: AggregateId
    entry_ids: tuple[str, ...]
    outbox: tuple[str | None, ...] | None = field(default=None, compare=False)
    revision: str | None = field(default=None, compare=False)
    payloads: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class FailurePlan:
    """Record a failed publish on one pending entry. Never touches ``version``."""

    aggregate_id: AggregateId
    entry_id: str
    attempts: int
    last_error: str


@dataclass(frozen=True)
class ReleasePlan:
    """Release a due scheduled entry for publishing and number it, if it is still pending,
    not released, not cancelled, and the document's ``outbox_seq`` is still
    ``outbox_seq`` (compared as the databases compare numbers: a stored ``true`` is not
    1, a stored 1.0 is): the entry gets ``seq = outbox_seq + 1``, ``outbox_seq`` becomes that
    number, and ``version`` is incremented, so a business commit computed from the same
    ``outbox_seq`` (guarded by ``version`` only) conflicts instead of reusing the number.
    A cancel guarded by the entry not being released then fails instead (see
    :mod:`docoutbox.store.schedule`)."""

    aggregate_id: AggregateId
    entry_id: str
    outbox_seq: int


@dataclass(frozen=True)
class SettlePlan:
    """Set the document's ``earliest_due`` (None: remove it), if the document's
    ``version`` is still ``version``: no commit added an entry since. Never touches
    ``version``."""

    aggregate_id: AggregateId
    version: int
    earliest_due: datetime | None


WritePlan = InsertPlan | CommitPlan | TrimPlan | FailurePlan | ReleasePlan | SettlePlan


def entry_id(aggregate_type: str, aggregate_id: AggregateId, seq: int) -> str:
    """The deterministic ID of the entry numbered ``seq`` of an aggregate."""
    return str(uuid.uuid5(DETERMINISTIC_NAMESPACE, f"{aggregate_type}/{aggregate_id}/{seq}"))


def scheduled_entry_id(
    aggregate_type: str, aggregate_id: AggregateId, version: int, cause: str, offset: int
) -> str:
    """The deterministic ID of a scheduled entry (numbered only when released): the
    ``offset``-th emit of the handling of message ``cause`` by the commit to ``version``."""
    name = f"{aggregate_type}/{aggregate_id}/scheduled/{version}/{cause}/{offset}"
    return str(uuid.uuid5(DETERMINISTIC_NAMESPACE, name))


def seal(
    emits: Sequence[Emit],
    *,
    aggregate_id: AggregateId,
    aggregate_type: str,
    last_seq: int,
    cause: Message,
    now: datetime,
    deterministic_ids: bool,
    version: int = 0,
) -> list[dict[str, Any]]:
    """Number and stamp a handler's emits as stored outbox entries, seq ``last_seq + 1`` on.

    A scheduled emit is stored without a ``seq`` and takes no number: it is numbered when
    the dispatcher releases it (:class:`ReleasePlan`), so a cancelled one never leaves a
    gap in the aggregate's sequence. ``version``: the version the commit writes (it names
    scheduled entries when IDs are deterministic).

    Every input is already validated (the emits, the cause, the aggregate ID), so the
    entries are built directly in their stored form; :class:`OutboxMessage` reads them.
    """
    sealed = []
    seq = last_seq
    for offset, item in enumerate(emits, start=1):
        due = item.due(now) if item.scheduled else None
        if due is None:
            seq += 1
        if item.id is not None:
            message_id = item.id
        elif not deterministic_ids:
            message_id = str(uuid.uuid4())
        elif due is None:
            message_id = entry_id(aggregate_type, aggregate_id, seq)
        else:
            message_id = scheduled_entry_id(aggregate_type, aggregate_id, version, cause.id, offset)
        entry: dict[str, Any] = {
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
        if due is not None:
            del entry["seq"]
            entry[DUE] = ceil_millis(due)
            if item.key is not None:
                entry[KEY] = item.key
        sealed.append(entry)
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
    entries = (
        seal(
            decision.emits,
            aggregate_id=snapshot.aggregate_id,
            aggregate_type=snapshot.aggregate_type,
            last_seq=snapshot.outbox_seq,
            cause=message,
            now=now,
            deterministic_ids=deterministic_ids,
            version=snapshot.version + 1,
        )
        if decision.emits
        else []
    )
    marks = None
    inbox_push: tuple[str, ...] = ()
    inbox_after = None
    if policy.exact and message.source is not None and message.seq is not None:  # uses_marks
        marks = marks_to_doc(record_mark(policy, snapshot.marks, message))
    elif policy.window:
        inbox_push = (message.id,)
        inbox_after = appended(snapshot.inbox, message.id, policy.window)
    if entries or decision.cancels or snapshot.raw_outbox or snapshot.cancelled:
        cancel_ids, sets_due, hint = _schedule(snapshot, decision, entries)
    else:  # what _schedule answers when there is nothing to schedule or cancel
        cancel_ids, sets_due, hint = (), False, None
    plan: CommitPlan = object.__new__(CommitPlan)
    plan.__dict__.update(  # fast_frozen(CommitPlan, ...) without its call
        aggregate_id=snapshot.aggregate_id,
        expected_version=snapshot.version,
        state=decision.state.model_dump(mode="json") if state is None else state,
        outbox_push=tuple(entries),
        outbox_seq=snapshot.outbox_seq + sum(1 for entry in entries if "seq" in entry)
        if entries
        else snapshot.outbox_seq,
        inbox_push=inbox_push,
        inbox_window=policy.window,
        inbox_after=inbox_after,
        inbox_marks=marks,
        updated_at=now,
        cancel_ids=cancel_ids,
        sets_due=sets_due,
        earliest_due=hint,
    )
    return plan, entries


def _schedule(
    snapshot: Snapshot[Any], decision: Decision[Any], entries: Sequence[dict[str, Any]]
) -> tuple[tuple[str, ...], bool, datetime | None]:
    """The entries ``decision`` cancels, whether the commit sets ``earliest_due``, and to
    what. A cancel of a key with no cancellable entry cancels nothing (see
    :class:`~docoutbox.model.Cancel`); a new key must not name a pending entry that stays."""
    scheduled = bool(entries) and any(DUE in entry for entry in entries)
    if not (decision.cancels or scheduled or snapshot.cancelled) and not (
        snapshot.raw_outbox and any(DUE in entry for entry in snapshot.raw_outbox)
    ):
        return (), False, None
    pending = cancellable(snapshot.raw_outbox, snapshot.cancelled)
    cancel_ids = tuple(pending[key][0] for key in decision.cancels if key in pending)
    taken = {key for key in pending if key not in decision.cancels}
    for entry in entries:
        key = entry.get(KEY)
        if key is None:
            continue
        if key in taken:
            raise InvalidHandlerResult(
                f"a scheduled message with key {key!r} is already pending on "
                f"{snapshot.aggregate_id!r}: cancel it in the same decision to replace it"
            )
        taken.add(key)
    gone = (*snapshot.cancelled, *cancel_ids)
    return cancel_ids, True, earliest_due((*snapshot.raw_outbox, *entries), gone)


def cancelled_keys(snapshot: Snapshot[Any], plan: CommitPlan) -> tuple[str, ...]:
    """The keys of the entries ``plan`` cancels."""
    ids = set(plan.cancel_ids)
    return tuple(
        entry[KEY] for entry in snapshot.raw_outbox if entry.get("id") in ids and KEY in entry
    )


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
    payloads: bool = False,
) -> TrimPlan:
    """``outbox``, ``revision``: hints of where the entries are; ``payloads``: whether
    payloads are deleted after it (see :class:`TrimPlan`)."""
    hint = None if outbox is None else tuple(outbox)
    return TrimPlan(aggregate_id, tuple(dict.fromkeys(entry_ids)), hint, revision, payloads)


def _same_number(stored: Any, expected: int) -> bool:
    """Whether a stored counter equals ``expected`` as a database's filter compares them:
    by numeric value whatever the number's type (``3.0`` is 3), and a boolean never (MongoDB
    and Cosmos DB keep ``true`` apart from 1, where Python's ``True == 1``)."""
    return isinstance(stored, int | float) and not isinstance(stored, bool) and stored == expected


def apply_plan(doc: Document | None, plan: WritePlan) -> Document | None:
    """The document after ``plan``, or None when the plan would not apply to ``doc``."""
    if type(plan) is CommitPlan:  # the commit path's every write: checked first
        return None if doc is None else _listed(committed(doc, plan))
    if isinstance(plan, InsertPlan):
        return None if doc is not None else dict(plan.document)
    if doc is None:
        return None
    if isinstance(plan, TrimPlan):
        drop = set(plan.entry_ids)
        after = {**doc, "outbox": [e for e in doc.get("outbox", ()) if e.get("id") not in drop]}
        if isinstance(doc.get(CANCELLED), list):  # a malformed one is left as it is
            after[CANCELLED] = [i for i in doc[CANCELLED] if i not in drop]
        return after
    if isinstance(plan, ReleasePlan):
        if _may_be_cancelled(doc.get(CANCELLED), plan.entry_id):
            return None
        if not _same_number(doc.get("outbox_seq"), plan.outbox_seq):
            return None
        outbox = list(doc.get("outbox", ()))
        for index, entry in enumerate(outbox):
            if entry.get("id") == plan.entry_id and release_open(entry):
                seq = plan.outbox_seq + 1
                outbox[index] = {**entry, "seq": seq, RELEASED: True}
                version = doc.get("version", 0)
                return {**doc, "outbox": outbox, "outbox_seq": seq, "version": version + 1}
        return None
    if isinstance(plan, SettlePlan):
        if not _same_number(doc.get("version"), plan.version):
            return None
        settled = {**doc, EARLIEST_DUE: plan.earliest_due}
        if plan.earliest_due is None:
            del settled[EARLIEST_DUE]
        return settled
    if isinstance(plan, FailurePlan):
        outbox = list(doc.get("outbox", ()))
        for index, entry in enumerate(outbox):
            if entry.get("id") == plan.entry_id:
                outbox[index] = {**entry, "attempts": plan.attempts, "last_error": plan.last_error}
                return {**doc, "outbox": outbox}
        return None
    return _listed(committed(doc, plan))


def _may_be_cancelled(cancelled: object, entry_id: str) -> bool:
    """Whether a document's ``cancelled`` forbids releasing ``entry_id``: an array naming
    it, or any value but an array or null (malformed: it may name the entry, and a
    database matches no array element inside it)."""
    if cancelled is None:
        return False
    return not isinstance(cancelled, list | tuple) or entry_id in cancelled


def _listed(doc: Document | None) -> Document | None:
    """``doc`` with its inbox as a list, as a database returns an array."""
    if doc is not None and type(doc.get("inbox")) is tuple:
        doc["inbox"] = list(doc["inbox"])
    return doc


def committed(doc: Document, plan: CommitPlan) -> Document | None:
    """``doc`` after the commit ``plan`` (None: its version or cancels do not match).

    The new inbox is the plan's own ``inbox_after`` tuple, shared (it is immutable), so
    a commit builds it once: the store's cached copy keeps it and the next snapshot reads
    it without a copy. :func:`apply_plan` gives the same document with a list."""
    if not _same_number(doc.get("version"), plan.expected_version):
        return None
    if plan.cancel_ids and not _cancellable(doc, plan.cancel_ids):
        return None
    after = {
        **doc,
        "state": plan.state,
        "version": plan.expected_version + 1,
        "outbox": [*doc.get("outbox", ()), *plan.outbox_push],
        "outbox_seq": plan.outbox_seq,
        "updated_at": plan.updated_at,
    }
    if plan.inbox_after is not None:
        after["inbox"] = plan.inbox_after
    elif plan.inbox_push:
        after["inbox"] = kept_window(doc.get("inbox", ()), plan.inbox_push, plan.inbox_window)
    if plan.inbox_spill is not None:
        after["inbox_spill"] = dict(plan.inbox_spill)
    if plan.inbox_marks is not None:
        after["inbox_marks"] = list(plan.inbox_marks)
    if plan.state_version is not None:
        after["state_version"] = plan.state_version
    if plan.cancel_ids or doc.get(CANCELLED):
        # IDs of cancelled entries trimmed since (a store whose trims leave them) go.
        present = {e.get("id") for e in after["outbox"]}
        kept = [i for i in (*doc.get(CANCELLED, ()), *plan.cancel_ids) if i in present]
        after[CANCELLED] = kept
    if plan.sets_due:
        after[EARLIEST_DUE] = plan.earliest_due
        if plan.earliest_due is None:
            del after[EARLIEST_DUE]
    return after


def _cancellable(doc: Document, entry_ids: Sequence[str]) -> bool:
    """Whether every one of ``entry_ids`` is in the outbox and neither released nor
    malformed (:func:`~docoutbox.store.schedule.release_open`)."""
    open_ids = {e.get("id") for e in doc.get("outbox", ()) if release_open(e)}
    return all(i in open_ids for i in entry_ids)


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
    "ReleasePlan",
    "SettlePlan",
    "TrimPlan",
    "WritePlan",
    "apply_plan",
    "committed",
    "entry_id",
    "guard_size",
    "plan_commit",
    "plan_trim",
    "scheduled_entry_id",
    "seal",
]
