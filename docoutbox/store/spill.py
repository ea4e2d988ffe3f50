"""Inbox spill-over: the oldest inbox IDs move to an archive instead of being forgotten.

With ``InboxPolicy(spill=True)``, a commit that would push IDs out of the document's
window (the window is full), or whose document would cross the database's size limit,
moves the oldest IDs to the store's inbox archive (:mod:`docoutbox.ports.archive`)
instead of evicting them or refusing the write. De-duplication stays exact:

- Rule 1 (archive first): the IDs a commit removes from the inbox are written to the
  archive, an idempotent upsert, BEFORE that commit is attempted. So an ID processed once
  is always in the document's window or in the archive, or both.
- Rule 2 (document, then archive): a message whose ID is not in the window of a document
  that has spilled (its ``inbox_spill`` field) is looked up in the archive AFTER that
  document was read. If the ID left the window by a commit the reader's document already
  shows, that commit's archive write finished before it, hence before the read; if the
  ID was committed after the reader's read, the reader's own commit is guarded by the
  older version and conflicts. Either way a processed ID is found.
- Rule 3 (pay only when spilled): a document that never spilled has no ``inbox_spill``
  field, and its messages are never looked up.

A spill takes the oldest half of the window at once (at least the IDs that overflow),
so the archive is written once every ``window // 2`` new messages, not on every one.
``inbox_spill`` holds ``count``, the number of IDs spilled (an upper bound: a retried
commit may archive the same IDs again), and ``token``, the archive's consistency token
of the last spill (Cosmos DB: the session token of its write), which the lookup passes
on so that another process's read sees that write.

Exact (watermark) de-duplication never spills its marks: the watermark already covers
every sequence number up to ``hw``, and ``above`` is bounded by ``max_above`` on purpose
(reordering tolerance); exceeding it still raises InboxSaturated. Messages without
``source``/``seq`` use the window, which spills as above.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from docoutbox.errors import PermanentStoreError
from docoutbox.model import AggregateId, InboxPolicy, Message
from docoutbox.store.document import Document
from docoutbox.store.inbox import uses_marks
from docoutbox.store.plans import CommitPlan, InsertPlan, WritePlan

#: The document field saying the inbox spilled: ``{"count": n, "token": t | None}``.
SPILL = "inbox_spill"
#: Bytes a size bound adds for the spill field's token, written after it is measured.
SLACK = 512
#: The longest archive token a document stores (the rest of SLACK covers its JSON key).
MAX_TOKEN = SLACK - 64


@dataclass(frozen=True)
class Archive:
    """Operation: upsert ``ids`` into the inbox archive of ``aggregate_id``; resolves to
    the archive's consistency token of that write (or None)."""

    aggregate_id: AggregateId
    ids: tuple[str, ...]


@dataclass(frozen=True)
class Archived:
    """Operation: which of ``ids`` the archive of ``aggregate_id`` holds; resolves to a
    collection of those IDs. ``token``: the last spill's consistency token."""

    aggregate_id: AggregateId
    ids: tuple[str, ...]
    token: str | None


SpillOp = Archive | Archived


def spilled(doc: Document | None) -> tuple[int, str | None]:
    """How many IDs ``doc`` spilled (0: never), and the last spill's token."""
    if doc is None:
        return 0, None
    field = doc.get(SPILL)
    if not isinstance(field, dict):
        return 0, None
    count = field.get("count")
    token = field.get("token")
    return (count if type(count) is int else 0), (token if isinstance(token, str) else None)


def lookup(policy: InboxPolicy, doc: Document | None, message: Message) -> Archived | None:
    """The archive lookup that decides whether ``message`` (not in ``doc``'s window) was
    processed, or None when none is needed (no spill, or exact de-duplication)."""
    if not policy.spill or uses_marks(policy, message):
        return None
    count, token = spilled(doc)
    if not count:
        return None
    assert doc is not None
    return Archived(doc["_id"], (message.id,), token)


def lookup_many(
    policy: InboxPolicy, doc: Document | None, messages: Sequence[Message]
) -> Archived | None:
    """One lookup for every windowed message of ``messages`` not in ``doc``'s window."""
    if not policy.spill:
        return None
    count, token = spilled(doc)
    if not count:
        return None
    assert doc is not None
    inbox = set(doc.get("inbox") or ())
    ids = tuple(
        dict.fromkeys(m.id for m in messages if not uses_marks(policy, m) and m.id not in inbox)
    )
    return Archived(doc["_id"], ids, token) if ids else None


def plan_spill(
    plan: CommitPlan, doc: Document | None, policy: InboxPolicy, *, everything: bool = False
) -> CommitPlan:
    """``plan`` moving the IDs it would evict from ``doc``'s window to the archive.

    When the window overflows, the oldest IDs go, down to half the window (never the IDs
    the plan itself records). ``everything``: every ID but the plan's own goes (the
    document is too large). Unchanged when nothing needs to move or spill is off.
    """
    if not policy.spill or doc is None:
        return plan
    inbox: tuple[str, ...] = tuple(doc.get("inbox") or ())
    pushed = plan.inbox_push
    joined = inbox + tuple(i for i in pushed if i not in inbox)
    if everything:
        keep = len(pushed)
    elif len(joined) <= policy.window:
        return plan
    else:
        keep = max(policy.window - policy.window // 2, len(pushed))
    moved = joined[: len(joined) - keep]
    if not moved:
        return plan
    count, _ = spilled(doc)
    return replace(
        plan,
        inbox_after=joined[len(joined) - keep :],
        inbox_spilled=moved,
        inbox_spill={"count": count + len(moved), "token": None},
    )


def commit_steps(
    plan: CommitPlan, write: Callable[[WritePlan], Any], insert: InsertPlan | None = None
) -> Generator[Any, Any, tuple[bool, CommitPlan]]:
    """Rule 1: archive ``plan``'s spilled IDs, then yield ``write(plan)`` (or
    ``write(insert)`` for a new document), the plan carrying the archive write's token.
    Returns (applied, the plan as written)."""
    if plan.inbox_spilled:
        token = yield Archive(plan.aggregate_id, plan.inbox_spilled)
        if token is not None and len(token) > MAX_TOKEN:
            raise PermanentStoreError(
                f"{plan.aggregate_id!r}: the inbox archive returned a token of {len(token)} "
                f"characters; at most {MAX_TOKEN} fit the room a spill reserves"
            )
        assert plan.inbox_spill is not None
        plan = replace(plan, inbox_spill={**plan.inbox_spill, "token": token})
    applied: bool = yield write(plan if insert is None else insert)
    return applied, plan


def written(after: Document, plan: CommitPlan) -> Document:
    """``after`` (the document ``plan`` produces) with the spill field as written."""
    if plan.inbox_spill is not None:
        after[SPILL] = dict(plan.inbox_spill)
    return after
