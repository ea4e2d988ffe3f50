"""The orphan sweep: removes payloads that no pending entry refers to, left by crashes.

Orphans come from a handle that put its payloads and then did not commit (a crash, a
conflict retried with other entries, a handler failing after a retry), from a
dispatcher that crashed between a trim and the delete after it, from a failed delete,
and from published references (whose payloads consumers fetch within the grace).

Rule: a payload is deleted only if it was put more than ``grace`` seconds ago **and**
no entry of its aggregate and no dead letter refers to it, read after the payload was
listed. A quarantined claim-checked entry is dead-lettered with its reference and its
payload stays for it (:mod:`docoutbox.dispatch.engine.flow`); a replay puts the entry
back on the outbox, and then deletes the dead letter. The sweep reads the outbox, then
the dead letters, then the outbox again: a quarantine writes the dead letter before the
trim, and a replay appends the entry before it deletes the dead letter, so a reference
moving either way between the two is seen by one of the three reads. The delete
is conditional on the very put listed (:meth:`~docoutbox.ports.payloads.PayloadStore.delete_stale`):
a payload put again since (a slow handle refreshing it, rule 2 of
:mod:`docoutbox.stored.claim`) is kept. A handle commits a reference only to a put
younger than ``grace * refresh``, so the sweep never removes a payload a commit is
about to reference.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from docoutbox.drive import drive, drive_async
from docoutbox.errors import InvalidConfig
from docoutbox.ports.payloads import (
    AsyncClaimedByDeadLetters,
    AsyncPayloadStore,
    ClaimedByDeadLetters,
    PayloadInfo,
    PayloadStore,
)
from docoutbox.ports.store import AsyncStoreBackend, StoreBackend
from docoutbox.retry import check_int, check_seconds
from docoutbox.store.core import Load
from docoutbox.store.document import Document, utcnow
from docoutbox.stored.claim import (
    DeleteStale,
    FindStale,
    PayloadOp,
    perform_payload,
    perform_payload_async,
)
from docoutbox.stored.reference import claim_of


@dataclass(frozen=True)
class DeadLettered:
    """Ask the dead-letter store whether a dead letter refers to a payload."""

    payload_id: str


SweepOp = FindStale | Load | DeadLettered | DeleteStale


@dataclass
class SweepReport:
    """What one sweep did, by payload ID."""

    deleted: list[str] = field(default_factory=list)
    #: Stale, but a pending entry or a dead letter still refers to it.
    referenced: list[str] = field(default_factory=list)
    #: Put again (or deleted) between the listing and the delete: kept.
    refreshed: list[str] = field(default_factory=list)


def referenced(doc: Document | None, payload_id: str) -> bool:
    """Whether an entry of ``doc``'s outbox refers to ``payload_id``."""
    if doc is None:
        return False
    for entry in doc.get("outbox") or ():
        claim = claim_of(entry)
        if claim is not None and claim.get("id") == payload_id:
            return True
    return False


def stale_before(now: datetime, grace: float) -> datetime:
    """The time a payload must have been put before to be swept at ``now``."""
    return now - timedelta(seconds=grace)


def sweep_flow(now: datetime, grace: float, limit: int) -> Generator[SweepOp, Any, SweepReport]:
    """One page of the sweep at ``now``: up to ``limit`` payloads put over ``grace``
    seconds before."""
    report = SweepReport()
    stale: list[PayloadInfo] = yield FindStale(stale_before(now, grace), limit)
    for info in stale:
        if (yield from _held(info)):
            report.referenced.append(info.payload_id)
        elif (yield DeleteStale(info)):
            report.deleted.append(info.payload_id)
        else:
            report.refreshed.append(info.payload_id)
    return report


def _held(info: PayloadInfo) -> Generator[SweepOp, Any, bool]:
    """Whether an entry or a dead letter refers to ``info``'s payload: the outbox, the
    dead letters, the outbox again (see the module doc)."""
    if referenced((yield Load(info.aggregate_id)), info.payload_id):
        return True
    if (yield DeadLettered(info.payload_id)):
        return True
    return referenced((yield Load(info.aggregate_id)), info.payload_id)


def _checked(grace: float, limit: int, now: datetime | None) -> datetime:
    check_seconds("grace", grace, positive=True)
    check_int("limit", limit, 1, 1_000_000)
    if now is not None and (not isinstance(now, datetime) or now.tzinfo is None):
        raise InvalidConfig(f"now must be a timezone-aware datetime, got {now!r}")
    return now or utcnow()


def sweep_orphans(
    backend: StoreBackend,
    payloads: PayloadStore,
    grace: float,
    *,
    dead_letters: ClaimedByDeadLetters | None,
    limit: int = 1000,
    now: datetime | None = None,
) -> SweepReport:
    """Remove up to ``limit`` orphaned payloads put more than ``grace`` seconds before
    ``now`` (default: the time now). ``grace`` must be the stores' ``ClaimCheck.grace``
    (or longer). ``dead_letters``: the dispatchers' dead-letter store, whose dead
    letters keep their payloads (None only where no dispatcher quarantines into one)."""
    at = _checked(grace, limit, now)

    def perform(op: SweepOp) -> Any:
        if isinstance(op, Load):
            return backend.load(op.aggregate_id)
        if isinstance(op, DeadLettered):
            return dead_letters is not None and dead_letters.refers_to(op.payload_id)
        return perform_payload(op, payloads)

    report: SweepReport = drive(sweep_flow(at, grace, limit), perform)
    return report


async def sweep_orphans_async(
    backend: AsyncStoreBackend,
    payloads: AsyncPayloadStore,
    grace: float,
    *,
    dead_letters: AsyncClaimedByDeadLetters | None,
    limit: int = 1000,
    now: datetime | None = None,
) -> SweepReport:
    """The async twin of :func:`sweep_orphans`."""
    at = _checked(grace, limit, now)

    async def perform(op: SweepOp) -> Any:
        if isinstance(op, Load):
            return await backend.load(op.aggregate_id)
        if isinstance(op, DeadLettered):
            return dead_letters is not None and await dead_letters.refers_to(op.payload_id)
        payload_op: PayloadOp = op
        return await perform_payload_async(payload_op, payloads)

    run: Callable[[SweepOp], Awaitable[Any]] = perform
    report: SweepReport = await drive_async(sweep_flow(at, grace, limit), run)
    return report
