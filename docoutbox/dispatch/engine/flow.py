"""Pure dispatch decisions: publish one aggregate's pending entries in ``seq`` order, then trim.

:func:`dispatch_document` is a sans-IO flow like those in :mod:`docoutbox.store.core`. It
yields :class:`Publish`, :class:`Quarantine`, :class:`~docoutbox.store.core.Write` (one
batched trim) and :class:`~docoutbox.store.core.Sleep`; a sync or async engine performs them.

Failure handling, per entry:

- :class:`~docoutbox.errors.PublishError` (a nack, a return): retried with exponential
  backoff and jitter; after ``max_attempts`` the entry is quarantined.
- :class:`~docoutbox.errors.PermanentPublishError` or a malformed stored entry:
  quarantined at once.
- :class:`~docoutbox.errors.BrokerUnavailable`: publishing stops; what was published is
  trimmed, the rest stays pending (``result.unavailable``) and the engine retries the
  document later. It never counts against an entry.

A quarantined entry is written to the dead-letter store *before* it is trimmed, and the
entries after it keep flowing.

Stored values (:mod:`docoutbox.stored`): each entry is decoded and upcast before it is
published, so the broker gets the plain, current payload. An entry that does not decode
(:class:`~docoutbox.errors.CorruptValue`) or upcast is malformed and quarantined; one that
needs a codec or key the dispatcher was not given (:class:`~docoutbox.errors.CodecError`)
stops the flow with that error (the engine logs the failed run and retries the aggregate
later, its entries pending), since quarantining every entry of a misconfigured
dispatcher would be wrong. With a codec, the dead-letter store gets the entry as stored
(encoded), never its plaintext. Entries after a still-failing entry are never published
ahead of it (per-aggregate order, I4).

Claim-checked entries (:mod:`docoutbox.stored.claim`): the payload is read back from the
payload store before the entry is published; a missing or partial one
(:class:`~docoutbox.errors.PayloadMissing`) leaves the entry, and those after it,
pending (``result.missing``), neither published nor trimmed. The payloads of published
entries are deleted once their trim has applied, never before. A quarantined
claim-checked entry is dead-lettered as stored, with its reference (a dead letter holding
the payload could exceed the database's size limit, and the run would fail at every
try); its payload is kept for the dead letter, which a replay puts back on the outbox.

Scheduled entries (:mod:`~docoutbox.dispatch.engine.due`): only those due at ``now`` are
published, after the numbered ones, each after a release write that numbers it next in
the aggregate's sequence. A release fails if the entry was cancelled, or if the
aggregate's ``outbox_seq`` moved since the run read it (a commit added entries): the
entry is then neither published nor trimmed, and neither is any scheduled entry after it
in this run; a later run (the commit's change, or the due query at once) tries again.
Cancelled entries are trimmed unpublished; the run ends with a settle of the document's
due-time hint. A document whose ``outbox_seq`` is not a sequence number cannot number a
release (its guard would never match, and every run would try again at once): its due
entries are quarantined with that reason.
"""

from __future__ import annotations

import random
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, overload

from docoutbox.dispatch.engine.due import (
    bad_due,
    bad_released,
    due_order,
    release_plan,
    settle_plan,
)
from docoutbox.errors import (
    BrokerUnavailable,
    InvalidInput,
    PayloadMissing,
    PermanentPublishError,
    PublishError,
    StoreError,
)
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.retry import MAX_COUNT, backoff, check_int, check_seconds
from docoutbox.store.core import Sleep, Write
from docoutbox.store.document import ID, REVISION, Document, is_sequence_number
from docoutbox.store.plans import FailurePlan, plan_trim
from docoutbox.store.schedule import CANCELLED, due_of
from docoutbox.stored.claim import DeletePayloads, GetPayload, resolve_stored
from docoutbox.stored.reference import claim_of
from docoutbox.stored.sweep import DeadLettered
from docoutbox.stored.values import StoredValues, open_entry


@dataclass(frozen=True)
class Publish:
    """Publish one entry and wait for the broker's confirmation."""

    entry: OutboxMessage


@dataclass(frozen=True)
class Quarantine:
    """Record an entry that cannot be published, with why, in the dead-letter store."""

    aggregate_id: AggregateId
    entry: dict[str, Any]
    error: str
    attempts: int


DispatchOp = Publish | Quarantine | Write | Sleep | GetPayload | DeadLettered | DeletePayloads


@dataclass(frozen=True)
class DispatchPolicy:
    """Retries per entry within one pass, and ordering."""

    max_attempts: int = 5  # at least 1
    #: Trim after this many published entries, so a crash re-publishes at most this many
    #: entries per aggregate (the rest of a large backlog was already trimmed).
    trim_every: int = 100
    base_delay: float = 0.05
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        check_int("DispatchPolicy.max_attempts", self.max_attempts, 1, MAX_COUNT)
        check_int("DispatchPolicy.trim_every", self.trim_every, 1, MAX_COUNT)
        check_seconds("DispatchPolicy.base_delay", self.base_delay)
        check_seconds("DispatchPolicy.max_delay", self.max_delay)


class _MadeOnUse:
    """A list of entries of a :class:`DispatchResult`, made when first used and kept in
    its ``lists`` under the attribute's name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, result: None, owner: type) -> _MadeOnUse: ...

    @overload
    def __get__(self, result: DispatchResult, owner: type) -> list[str]: ...

    def __get__(self, result: DispatchResult | None, owner: type) -> list[str] | _MadeOnUse:
        if result is None:
            return self
        found = result.lists.get(self.name)
        if found is None:
            found = result.lists[self.name] = []
        return found


@dataclass
class DispatchResult:
    """What a run did with a document's entries.

    Besides ``published``, the lists of entries are made when first used: most runs have
    none, and a run holds its result until it ends (every list held is one more object
    for the garbage collector to scan, for every run in flight).
    """

    aggregate_id: AggregateId
    published: list[str] = field(default_factory=list)
    trimmed: bool = False
    #: The earliest due time of the entries left because they were not due yet, or
    #: because their release lost a race with a commit (then already due).
    next_due: datetime | None = None
    #: The other lists, by name, once made.
    lists: dict[str, list[str]] = field(default_factory=dict)

    #: Entries quarantined (dead-lettered) by the run.
    quarantined = _MadeOnUse()
    #: Entries left pending because the broker became unavailable.
    held = _MadeOnUse()
    #: Cancelled scheduled entries trimmed without a publish.
    dropped = _MadeOnUse()
    #: Due scheduled entries left unreleased: their release lost a race with a commit.
    raced = _MadeOnUse()
    #: Claim-checked entries left pending: their payload is missing from the payload
    #: store (or only in part); they, and the entries after them, are tried again later.
    missing = _MadeOnUse()
    #: Payloads of trimmed entries whose delete failed (the orphan sweep removes them).
    orphaned = _MadeOnUse()

    @property
    def unavailable(self) -> bool:
        return bool(self.lists.get("held"))

    def removed(self) -> list[str]:
        """The entries the run's trims removed, applied or not: the dropped, published and
        quarantined ones."""
        lists = self.lists
        return [*lists.get("dropped", ()), *self.published, *lists.get("quarantined", ())]

    def count(self, name: str) -> int:
        """How many entries the list ``name`` holds (none made: 0), without making it."""
        return len(self.published) if name == "published" else len(self.lists.get(name, ()))


def pending_entries(doc: Document) -> list[dict[str, Any]]:
    """The document's outbox in publish order (ascending ``seq``; unnumbered last)."""
    outbox = doc.get("outbox") or []

    def key(entry: Any) -> tuple[int, int]:
        seq = entry.get("seq") if isinstance(entry, dict) else None
        return (0, seq) if isinstance(seq, int) else (1, 0)

    return sorted(outbox, key=key)


def dispatch_document(
    doc: Document,
    policy: DispatchPolicy,
    rng: random.Random,
    values: StoredValues | None = None,
    now: datetime | None = None,
    references: bool = False,
) -> Generator[DispatchOp, Any, DispatchResult]:
    """Publish the document's pending entries in order, quarantine poison, trim in batches.

    ``values`` decodes and upcasts the stored entries (None: they are plain); ``now``: the
    time scheduled entries are due against (None: none is due); ``references``: publish
    claim-checked entries with their reference envelope as payload, unresolved, and leave
    their payloads to the orphan sweep (consumers fetch them)."""
    sealed = values is not None and values.codec is not None
    result = DispatchResult(doc[ID])
    #: The outbox as stored, less what was trimmed since: made for a first trim of
    #: ``trim_every`` entries (a run's only trim reads it from ``doc``).
    ids: list[str | None] | None = None
    revision = doc.get(REVISION)  # the tag of that copy: true for the first trim only
    revision = revision if isinstance(revision, str) else None
    order = due_order(doc, now, pending_entries(doc))
    seq, version = _counter(doc, "outbox_seq"), _counter(doc, "version")
    result.next_due = order.next_due
    if order.cancelled:
        result.dropped.extend(order.cancelled)
    removable: list[str] = list(order.cancelled)
    #: Whether every trim applied so far (None: none written yet).
    applied: bool | None = None
    blocked = False
    #: The payload ID of each claim-checked entry to remove, deleted once trimmed.
    claimed: dict[str, str] = {}
    for raw in order.entries:
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        reference = claim_of(raw)
        # A claim-checked entry as stored (its reference): what its quarantine records,
        # whether the run publishes its payload or its reference.
        kept = _as_dict(raw) if reference is not None and "payload" not in raw else None
        claim = None if references else reference
        if claim is not None and blocked and isinstance(raw_id, str):
            result.held.append(raw_id)  # not read from the payload store for nothing
            continue
        release = release_plan(result.aggregate_id, raw, seq)
        try:
            if bad_released(raw):  # before its payload is read: it is never published
                raise InvalidInput(f"released {raw.get('released')!r} is not a boolean")
            if release is not None and (numbering := _numbering_fault(doc)) is not None:
                raise InvalidInput(numbering)
            if claim is not None and "payload" not in raw:
                raw = yield from resolve_stored(raw)  # rule: never publish a reference
            numbered = raw if release is None else {**raw, "seq": seq + 1}
            entry: OutboxMessage = OutboxMessage.parse(open_entry(values, numbered))
            if bad_due(raw):
                raise InvalidInput(f"due {raw.get('due')!r} is not a time")
            if entry.seq is None:
                raise InvalidInput("an entry to publish has no seq")
        except PayloadMissing:
            if isinstance(raw_id, str):
                result.missing.append(raw_id)
                result.held.append(raw_id)
            blocked = True
            continue
        except InvalidInput as exc:
            dead = kept if kept is not None else _as_dict(raw)
            yield Quarantine(result.aggregate_id, dead, f"malformed entry: {exc}", 0)
            if isinstance(raw_id, str):
                removable.append(raw_id)
                result.quarantined.append(raw_id)
            continue
        if blocked:
            result.held.append(entry.id)
            continue
        if release is not None:
            if result.count("raced") or not (yield Write(release)):
                # Cancelled, released by another instance, or ``outbox_seq`` moved: never
                # published unreleased; a later run reads the document again.
                result.raced.append(entry.id)
                result.next_due = _earliest(result.next_due, raw)
                continue
            seq, version = seq + 1, version + 1
        stored = _as_dict(raw) if sealed else None
        if kept is not None:
            stored = kept  # dead-lettered by reference: its payload stays for it
        outcome = yield from _publish_with_retries(entry, policy, rng, stored)
        if outcome == "published":
            result.published.append(entry.id)
            removable.append(entry.id)
            if claim is not None and isinstance(claim.get("id"), str):
                claimed[entry.id] = claim["id"]
        elif outcome == "quarantined":
            result.quarantined.append(entry.id)
            removable.append(entry.id)
        else:
            result.held.append(entry.id)
            blocked = True
        if len(removable) >= policy.trim_every:
            ids = stored_ids(doc) if ids is None else ids
            frees = bool(claimed) and not claimed.keys().isdisjoint(removable)
            plan = plan_trim(result.aggregate_id, removable, ids, revision, frees)
            done = bool((yield Write(plan)))
            applied = done and applied is not False
            if done and claimed:
                yield from _delete_payloads(removable, claimed, result)
            ids, revision, removable = _without(ids, removable), None, []
    if removable:
        hint = stored_ids(doc) if ids is None else ids
        frees = bool(claimed) and not claimed.keys().isdisjoint(removable)
        plan = plan_trim(result.aggregate_id, removable, hint, revision, frees)
        done = bool((yield Write(plan)))
        applied = done and applied is not False
        if done and claimed:
            yield from _delete_payloads(removable, claimed, result)
    result.trimmed = bool(applied)
    settle = settle_plan(doc, result.removed(), version)
    if settle is not None:
        yield Write(settle)  # not applied: an entry came since, with a hint of its own
    return result


def _without(ids: list[str | None], trimmed: list[str]) -> list[str | None]:
    """``ids`` less those ``trimmed``: the position hint of the next trim."""
    gone = set(trimmed)
    return [i for i in ids if i not in gone]


def _delete_payloads(
    trimmed: list[str], claimed: dict[str, str], result: DispatchResult
) -> Generator[DispatchOp, Any, None]:
    """Rule: a payload is deleted only after the trim that removed its entry committed
    (called once the trim of ``trimmed`` applied, when some of them were claim-checked).
    A failed delete leaves an orphan, which the sweep removes: it is reported in
    ``result.orphaned``, never raised, since the entries were published and trimmed.

    Rule: a payload a dead letter refers to is kept. An entry quarantined once can still
    be published from another copy (a trim whose reply was lost, a second instance), and
    its dead letter must stay replayable: such a payload is left to the sweep, which
    keeps it while the dead letter lasts."""
    ids: list[str] = []
    for trimmed_id in trimmed:
        if trimmed_id not in claimed:
            continue
        try:
            if not (yield DeadLettered(claimed[trimmed_id])):
                ids.append(claimed[trimmed_id])
        except StoreError:
            result.orphaned.append(claimed[trimmed_id])  # unknown: the sweep decides
    if not ids:
        return
    try:
        yield DeletePayloads(tuple(ids))
    except StoreError:
        result.orphaned.extend(ids)


def _counter(doc: Document, name: str) -> int:
    """The document's ``outbox_seq`` or ``version`` (0 when absent or not a number)."""
    value = doc.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _numbering_fault(doc: Document) -> str | None:
    """Why the document cannot have a due entry released (None: it can).

    A release is guarded by ``outbox_seq`` being the value read and by ``cancelled``
    being an array (absent or null: nothing cancelled) that does not name the entry. An
    ``outbox_seq`` that is not a sequence number (not a non-negative integer, or absent)
    or a ``cancelled`` that is not an array never matches, so the release would fail at
    every run: the due entries are quarantined instead (I7), once, and the run goes on."""
    value = doc.get("outbox_seq")
    if not is_sequence_number(value):
        return (
            f"the document's outbox_seq {value!r} is not a sequence number: cannot number a release"
        )
    cancelled = doc.get(CANCELLED)
    if cancelled is not None and not isinstance(cancelled, list):
        return f"the document's cancelled {cancelled!r} is not an array: cannot release an entry"
    return None


def _earliest(current: datetime | None, raw: Any) -> datetime | None:
    due = due_of(raw)
    if due is None:
        return current
    return due if current is None or due < current else current


def stored_ids(doc: Document) -> list[str | None]:
    """The entry IDs of the document's outbox in stored order: a trim's position hint."""
    outbox = doc.get("outbox") or []
    return [
        e["id"] if isinstance(e, dict) and isinstance(e.get("id"), str) else None for e in outbox
    ]


def _publish_with_retries(
    entry: OutboxMessage,
    policy: DispatchPolicy,
    rng: random.Random,
    stored: dict[str, Any] | None = None,
) -> Generator[DispatchOp, Any, str]:
    """Attempts count from the entry's stored ``attempts``, so they survive restarts.

    ``stored``: the entry as stored, quarantined instead of its plain form (encoded
    values stay encoded in the dead-letter store)."""
    attempt = entry.attempts
    while True:
        attempt += 1
        try:
            yield Publish(entry)
            return "published"
        except PermanentPublishError as exc:
            yield Quarantine(entry.aggregate_id, _dead(entry, stored), _describe(exc), attempt)
            return "quarantined"
        except BrokerUnavailable:
            return "held"
        except PublishError as exc:
            if attempt >= policy.max_attempts:
                yield Quarantine(entry.aggregate_id, _dead(entry, stored), _describe(exc), attempt)
                return "quarantined"
            error = _describe(exc)[:1000]
            yield Write(FailurePlan(entry.aggregate_id, entry.id, attempt, error))
            yield Sleep(backoff(attempt - entry.attempts, policy.base_delay, policy.max_delay, rng))


def _dead(entry: OutboxMessage, stored: dict[str, Any] | None) -> dict[str, Any]:
    """What a quarantine records of ``entry``: ``stored`` (as stored) if given, else its
    plain form."""
    return entry.model_dump() if stored is None else stored.copy()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _as_dict(raw: object) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else {"value": repr(raw)}


def checkpoint_after(done: Iterable[bool]) -> int:
    """How many leading events of a batch are complete: the checkpoint may pass those only.

    Stops reading ``done`` at the first incomplete event."""
    count = 0
    for ok in done:
        if not ok:
            break
        count += 1
    return count
