"""Which of a document's entries a run may publish now, and in what order (pure).

Rule (I4 with scheduled entries): order holds among the entries that are due.

- Entries without a due time are published in ``seq`` order, as always.
- Scheduled entries are published once due (``due <= now``), never before, ordered among
  themselves by due time, then ``seq``.
- The two sequences are merged by time: a scheduled entry goes ahead of the immediate
  entries created after its due time, and behind those created at or before it. The
  order within each sequence is never changed by the merge.
- An entry not yet due holds back nothing: later entries of the aggregate are published
  around it, and it is neither published nor trimmed.
- A cancelled entry (its ID in the document's ``cancelled``) is trimmed without being
  published.

A run without a time (``now`` None) treats every scheduled entry as not due.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from docoutbox.store.document import Document
from docoutbox.store.plans import ReleasePlan, SettlePlan
from docoutbox.store.schedule import (
    EARLIEST_DUE,
    RELEASED,
    as_utc,
    bad_due,
    cancelled_ids,
    due_of,
    pending_due,
)


@dataclass(frozen=True)
class DueOrder:
    """A run's view of a document at ``now``."""

    #: The entries to publish now, in publish order.
    entries: tuple[Any, ...]
    #: Cancelled entries still in the outbox: trimmed, never published.
    cancelled: tuple[str, ...]
    #: The earliest due time of the entries not yet due (None: none waits).
    next_due: datetime | None


def _seq_key(entry: Any) -> tuple[int, int]:
    seq = entry.get("seq") if isinstance(entry, dict) else None
    return (0, seq) if isinstance(seq, int) else (1, 0)


def due_order(doc: Document, now: datetime | None, outbox: Sequence[Any] | None = None) -> DueOrder:
    """The entries of ``doc`` to publish at ``now``, in order (see the module's rule).

    ``outbox``: the document's entries in ``seq`` order, when the caller has them sorted
    (the immediate ones keep that order); by default they are sorted here."""
    gone = cancelled_ids(doc)
    immediate: list[Any] = []
    scheduled: list[tuple[datetime, int, Any]] = []
    cancelled: list[str] = []
    later: datetime | None = None
    if outbox is None:
        outbox = sorted(doc.get("outbox") or [], key=_seq_key)
    for entry in outbox:
        entry_id = entry.get("id") if isinstance(entry, dict) else None
        if entry_id in gone:
            cancelled.append(entry_id)
            continue
        due = due_of(entry)
        if due is None:
            immediate.append(entry)  # including a malformed due: quarantined by the flow
        elif now is not None and due <= now:
            scheduled.append((due, _seq_key(entry)[1], entry))
        elif later is None or due < later:
            later = due
    scheduled.sort(key=lambda item: (item[0], item[1]))
    return DueOrder(tuple(_merged(immediate, scheduled)), tuple(cancelled), later)


def _merged(immediate: list[Any], scheduled: list[tuple[datetime, int, Any]]) -> list[Any]:
    """Both sequences, each in its own order, merged by time (see the module's rule)."""
    if not scheduled:
        return immediate
    merged: list[Any] = []
    i = 0
    for due, _, entry in scheduled:
        while i < len(immediate) and _created(immediate[i]) <= due:
            merged.append(immediate[i])
            i += 1
        merged.append(entry)
    merged.extend(immediate[i:])
    return merged


def _created(entry: Any) -> datetime:
    created = as_utc(entry.get("created_at")) if isinstance(entry, dict) else None
    return created if created is not None else datetime.min.replace(tzinfo=UTC)


def release_plan(aggregate_id: Any, entry: Any) -> ReleasePlan | None:
    """The write that releases a due scheduled ``entry`` before its publish (None: it
    needs none, being immediate or released already)."""
    if due_of(entry) is None or entry.get(RELEASED):
        return None
    return ReleasePlan(aggregate_id, entry["id"])


def settle_plan(doc: Document, removed: list[str]) -> SettlePlan | None:
    """The write that brings ``earliest_due`` up to date once ``removed`` are trimmed
    (None: it already is, or the document never had scheduled entries)."""
    hint = as_utc(doc.get(EARLIEST_DUE))
    after = pending_due(doc, removed)
    if hint == after:
        return None
    seq = doc.get("outbox_seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        return None
    return SettlePlan(doc["_id"], seq, after)


__all__ = ["DueOrder", "bad_due", "due_order", "release_plan", "settle_plan"]
