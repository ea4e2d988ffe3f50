"""Which of a document's entries a run may publish now, and in what order (pure).

Rule (I4 with scheduled entries): entries are published in ``seq`` order, and a scheduled
entry takes its ``seq`` only when it is released, once due.

- Numbered entries (immediate ones, and scheduled ones released already) are published
  in ``seq`` order, as always.
- A scheduled entry is stored without a ``seq``. Once due (``due <= now``), the run
  releases it just before publishing it: the release numbers it ``outbox_seq + 1``, so
  it comes after every entry numbered before. The due ones a run finds are released in
  order of due time, then stored order, after the numbered entries.
- An entry not yet due holds back nothing and takes no number: later entries of the
  aggregate are numbered and published around it, and it is neither published nor
  trimmed.
- A cancelled entry (its ID in the document's ``cancelled``) never gets a number (no gap
  in the sequence) and is trimmed without being published.

A run without a time (``now`` None) treats every scheduled entry as not due.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from docoutbox.store.document import Document
from docoutbox.store.plans import ReleasePlan, SettlePlan
from docoutbox.store.schedule import (
    EARLIEST_DUE,
    as_utc,
    bad_due,
    bad_released,
    cancelled_ids,
    due_of,
    is_released,
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
    return (0, seq) if isinstance(seq, int) and not isinstance(seq, bool) else (1, 0)


def unreleased(entry: Any) -> bool:
    """Whether ``entry`` is a scheduled entry not released yet (so not numbered yet)."""
    return due_of(entry) is not None and not is_released(entry)


def due_order(doc: Document, now: datetime | None, outbox: Sequence[Any] | None = None) -> DueOrder:
    """The entries of ``doc`` to publish at ``now``, in order (see the module's rule).

    ``outbox``: the document's entries in ``seq`` order (unnumbered last, in stored
    order), when the caller has them sorted; by default they are sorted here."""
    gone = cancelled_ids(doc)
    numbered: list[Any] = []
    scheduled: list[tuple[datetime, int, Any]] = []
    cancelled: list[str] = []
    later: datetime | None = None
    if outbox is None:
        outbox = sorted(doc.get("outbox") or [], key=_seq_key)
    for position, entry in enumerate(outbox):
        entry_id = entry.get("id") if isinstance(entry, dict) else None
        if entry_id in gone:
            cancelled.append(entry_id)
            continue
        due = due_of(entry)
        if due is None or is_released(entry):
            numbered.append(entry)  # including a malformed due: quarantined by the flow
        elif now is not None and due <= now:
            scheduled.append((due, position, entry))
        elif later is None or due < later:
            later = due
    scheduled.sort(key=lambda item: (item[0], item[1]))
    return DueOrder((*numbered, *(e for _, _, e in scheduled)), tuple(cancelled), later)


def release_plan(aggregate_id: Any, entry: Any, outbox_seq: int) -> ReleasePlan | None:
    """The write that releases and numbers a due scheduled ``entry`` before its publish,
    given the document's ``outbox_seq`` as the run knows it (None: it needs none, being
    numbered already)."""
    if not unreleased(entry):
        return None
    return ReleasePlan(aggregate_id, entry["id"], outbox_seq)


def settle_plan(doc: Document, removed: list[str], version: int | None = None) -> SettlePlan | None:
    """The write that brings ``earliest_due`` up to date once ``removed`` are trimmed,
    guarded by ``version``: the document's as read, plus the releases the run made since
    (None: the document's). None: it already is, or the document has no version."""
    hint = as_utc(doc.get(EARLIEST_DUE))
    after = pending_due(doc, removed)
    if hint == after:
        return None
    if version is None:
        version = doc.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            return None
    return SettlePlan(doc["_id"], version, after)


__all__ = [
    "DueOrder",
    "bad_due",
    "bad_released",
    "due_order",
    "release_plan",
    "settle_plan",
    "unreleased",
]
