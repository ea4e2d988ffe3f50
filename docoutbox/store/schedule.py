"""Scheduled entries: what is due, what may be cancelled, and the document's due-time hint.

Rule (the due-time hint): a document's top-level ``earliest_due`` is never later than the
due time of any of its pending scheduled entries, and is absent only when it has none.
It is a lower bound, not an exact value, because trims remove entries without reading
the document:

- a commit sets it from its own copy of the outbox, plus the entries it adds, less the
  entries it cancels. The copy holds every entry the document holds (a commit is guarded
  by ``version``; only trims remove entries without changing it), so the minimum can only
  be earlier than the exact one;
- a settle (:class:`~docoutbox.store.plans.SettlePlan`, written by the dispatcher after a
  run) sets it from the dispatcher's copy, guarded by ``version`` (the copy's, plus the
  run's own releases): no commit, so no entry, came since that copy was read, and
  removals only make the exact minimum later. (``outbox_seq`` could not guard it: a
  commit adding only scheduled entries leaves it unchanged.)

Rule (numbering, I4): a scheduled entry is stored without a ``seq`` and does not advance
``outbox_seq``; it is numbered when released (``seq = outbox_seq + 1``), so it takes its
place in the aggregate's sequence when it falls due. A cancelled entry is never numbered
and an entry not yet due holds no number back: receivers in exact de-duplication mode
see every number of the aggregate arrive, and their marks compact.

Rule (cancellation): a scheduled entry is cancelled by a business write that lists its ID
in ``cancelled``; the write is guarded by the entry being pending and not ``released``.
The dispatcher *releases* a due entry (one conditional write, guarded by its ID not being
in ``cancelled`` and by ``outbox_seq`` being the value it read) before it publishes it.
Whichever of the two writes lands first wins: a cancelled entry is never released (so
never published), a released entry is never cancelled. Cancelled entries are trimmed like
published ones, without being published.

Rule (release against commit): a release increments ``version``. Commits number their
entries from the ``outbox_seq`` they loaded and are guarded by ``version`` only, so a
commit read before a release conflicts and is retried on the reloaded document; a commit
that lands first moves ``outbox_seq`` (if it added entries) and the release fails. No two
entries of an aggregate ever share a ``seq``.

Rule (the release mark): an entry is released only when its ``released`` is exactly
``true``; absent or ``false``, it is not, and it may be released or cancelled. Any other
value (``1``, ``"yes"``, null) is malformed: neither released nor open, so no store
releases or cancels it and the dispatcher quarantines it (:func:`bad_released`). Every
store compares the same way (MongoDB's filters test the stored value's type, where Python
would take ``1`` for ``true``).

A scheduled entry carries ``due`` (UTC, stored to the millisecond, rounded up so that it is
never published early) and, optionally, ``key``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

#: The document's hint: the earliest due time of its pending scheduled entries.
EARLIEST_DUE = "earliest_due"
#: The document's list of cancelled entry IDs not yet trimmed.
CANCELLED = "cancelled"
#: An entry's due time, key and release mark.
DUE = "due"
KEY = "key"
RELEASED = "released"


def ceil_millis(moment: datetime) -> datetime:
    """``moment`` in UTC, rounded *up* to the millisecond (the precision stores keep)."""
    moment = moment.astimezone(UTC)
    extra = moment.microsecond % 1000
    return moment if not extra else moment + timedelta(microseconds=1000 - extra)


def as_utc(value: object) -> datetime | None:
    """A stored time as an aware UTC datetime: drivers may return naive UTC datetimes
    (pymongo without ``tz_aware``) or ISO text (JSON stores). None if it is neither."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return as_utc(parsed)
    return None


def due_of(entry: object) -> datetime | None:
    """The entry's due time, or None for an entry published as soon as possible."""
    if not isinstance(entry, dict) or entry.get(DUE) is None:
        return None
    return as_utc(entry[DUE])


def is_released(entry: object) -> bool:
    """Whether the entry is released: its ``released`` is exactly ``true``."""
    return isinstance(entry, dict) and entry.get(RELEASED) is True


def release_open(entry: object) -> bool:
    """Whether the entry may still be released or cancelled: ``released`` absent or
    ``false`` (a malformed value is neither released nor open)."""
    return isinstance(entry, dict) and (RELEASED not in entry or entry[RELEASED] is False)


def bad_released(entry: object) -> bool:
    """Whether the entry has a ``released`` that is not a boolean (malformed)."""
    return isinstance(entry, dict) and RELEASED in entry and not isinstance(entry[RELEASED], bool)


def bad_due(entry: object) -> bool:
    """Whether the entry has a ``due`` that cannot be read as a time (malformed)."""
    return isinstance(entry, dict) and entry.get(DUE) is not None and due_of(entry) is None


def cancelled_ids(doc: Mapping[str, Any]) -> frozenset[str]:
    """The entry IDs in the document's ``cancelled`` array (none when it is not an array:
    a malformed document, whose releases every store refuses)."""
    found = doc.get(CANCELLED)
    if not isinstance(found, list):
        return frozenset()
    return frozenset(i for i in found if isinstance(i, str))


def cancellable(
    outbox: Iterable[Mapping[str, Any]], cancelled: Iterable[str]
) -> dict[str, tuple[str, datetime]]:
    """Key -> (entry ID, due) of the pending scheduled entries a handler may cancel: not
    cancelled and not released."""
    gone = set(cancelled)
    found: dict[str, tuple[str, datetime]] = {}
    for entry in outbox:
        key, entry_id, due = entry.get(KEY), entry.get("id"), due_of(entry)
        if not isinstance(key, str) or not isinstance(entry_id, str) or due is None:
            continue
        if entry_id in gone or not release_open(entry):
            continue
        found[key] = (entry_id, due)
    return found


def earliest_due(
    entries: Iterable[Mapping[str, Any]], cancelled: Iterable[str] = ()
) -> datetime | None:
    """The earliest due time of ``entries`` that are scheduled and not cancelled."""
    gone = set(cancelled)
    dues = [
        due
        for entry in entries
        if (due := due_of(entry)) is not None and entry.get("id") not in gone
    ]
    return min(dues) if dues else None


def pending_due(doc: Mapping[str, Any], removed: Sequence[str] = ()) -> datetime | None:
    """The hint ``doc`` should carry once the entries ``removed`` are trimmed."""
    gone = set(removed) | cancelled_ids(doc)
    return earliest_due(doc.get("outbox") or (), gone)
