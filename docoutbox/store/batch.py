"""Batch handling: many messages for one aggregate in one load and one conditional write.

Rule: a batch is handled as if its messages were handled one after the other, in order,
yet with the fewest writes. Handlers run in order on the evolving state; a message
already in the inbox (or earlier in the same batch) is a duplicate; the inbox marks and
outbox entries of every applied message go into ONE commit (one ``version`` step). A
message whose handler raises is left out of the commit and gets its error: the messages
around it still commit (the failing message contributed nothing, as if it had not been
delivered yet). Nothing is half-applied: a commit either holds all of its messages or
none of them.

A batch is split into several commits only when it must be:

- **Inbox window.** One commit records at most ``window`` IDs, so that after an
  ambiguous write (a transient error) every ID of that commit is still in the inbox when
  the document is reloaded, and the inbox alone decides what was applied. Within one
  call, an ID applied earlier is a duplicate even when it has left the window since.
- **Document size.** When the commit would push the document over the database's limit,
  the commit is cut back to the longest prefix that fits; a message that does not fit
  on its own gets :class:`~docoutbox.errors.DocumentTooLarge`.

The flow is sans-IO (:mod:`docoutbox.store.core`'s operations), driven by the sync and
async stores alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from docoutbox.errors import (
    DocOutboxError,
    DocumentTooLarge,
    InvalidHandlerResult,
    InvalidPayload,
    NotFound,
    TransientStoreError,
)
from docoutbox.handlers import Decision, Handler, takes_context
from docoutbox.model import AggregateId, Message, check_aggregate_id
from docoutbox.store import spill
from docoutbox.store.core import Core, Flow, Load, Outcome, Sleep, Status, Write
from docoutbox.store.document import (
    Document,
    Snapshot,
    read_snapshot,
)
from docoutbox.store.inbox import Mark, is_duplicate, uses_marks
from docoutbox.store.plans import CommitPlan, InsertPlan, apply_plan, cancelled_keys, plan_commit

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class Item(Generic[S]):
    """One message of a batch, with the handler that decides it."""

    message: Message
    handler: Handler[S]
    create: bool = False
    #: Whether the handler takes a Context (decided once, when the item is made).
    contextual: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "contextual", takes_context(self.handler))


@dataclass(frozen=True)
class Failed:
    """A message of a batch that was not applied, with the reason. Nothing of it was written.

    Do not acknowledge it: redeliver it (after fixing the cause) like a failed ``handle``.
    """

    aggregate_id: AggregateId
    message_id: str
    error: Exception

    status = "failed"
    applied = False
    duplicate = False


Result = Outcome[S] | Failed


@dataclass(frozen=True)
class BatchOutcome(Generic[S]):
    """What a batch did: one result per message, in the order given."""

    aggregate_id: AggregateId
    results: tuple[Outcome[S] | Failed, ...]
    #: Conditional writes that applied, and all writes attempted (round trips that write).
    commits: int
    writes: int
    loads: int

    @property
    def failed(self) -> tuple[Failed, ...]:
        return tuple(r for r in self.results if isinstance(r, Failed))

    @property
    def round_trips(self) -> int:
        return self.writes + self.loads


@dataclass
class _Step(Generic[S]):
    """One applied message of a chunk: its plan from the state before it."""

    index: int
    plan: CommitPlan
    entries: list[dict[str, Any]]
    state: S
    #: The keys of the scheduled entries this message's decision cancelled.
    cancelled: tuple[str, ...] = ()


@dataclass
class _Chunk(Generic[S]):
    steps: list[_Step[S]]
    #: Tentative results of messages not written (duplicates, failures), by index.
    others: dict[int, Outcome[S] | Failed]
    #: Every index this chunk decided, in order (steps and others).
    covered: list[int]


def merge_plans(plans: Sequence[CommitPlan]) -> CommitPlan:
    """The one commit that records ``plans`` (made one after the other from one version)."""
    first, last = plans[0], plans[-1]
    marks = None
    for plan in plans:
        if plan.inbox_marks is not None:
            marks = plan.inbox_marks
    inbox_pushed = tuple(i for plan in plans for i in plan.inbox_push)
    inbox_after = None
    for plan in plans:
        if plan.inbox_after is not None:
            inbox_after = plan.inbox_after
    # An entry scheduled and cancelled within the chunk is never stored.
    cancels = [i for plan in plans for i in plan.cancel_ids]
    pushed = {e["id"] for plan in plans for e in plan.outbox_push}
    return CommitPlan(
        aggregate_id=first.aggregate_id,
        expected_version=first.expected_version,
        state=last.state,
        outbox_push=tuple(e for plan in plans for e in plan.outbox_push if e["id"] not in cancels),
        outbox_seq=last.outbox_seq,
        inbox_push=inbox_pushed,
        inbox_window=first.inbox_window,
        inbox_after=inbox_after,
        inbox_marks=marks,
        updated_at=last.updated_at,
        state_version=last.state_version,
        cancel_ids=tuple(i for i in cancels if i not in pushed),
        sets_due=last.sets_due,
        earliest_due=last.earliest_due,
    )


def _advance(snapshot: Snapshot[S], plan: CommitPlan, state: S) -> Snapshot[S]:
    """The snapshot as the next message of the chunk sees it (same stored version)."""
    marks = snapshot.marks
    if plan.inbox_marks is not None:
        marks = {
            m["source"]: Mark(m["source"], int(m["hw"]), tuple(m.get("above", ())))
            for m in plan.inbox_marks
        }
    return dataclasses.replace(
        snapshot,
        state=state,
        inbox=plan.inbox_after if plan.inbox_after is not None else snapshot.inbox,
        marks=marks,
        outbox_seq=plan.outbox_seq,
        raw_outbox=(*snapshot.raw_outbox, *plan.outbox_push),
        cancelled=(*snapshot.cancelled, *plan.cancel_ids),
    )


class BatchCore(Generic[S]):
    """The batch flow, over a store's :class:`~docoutbox.store.core.Core` (config, cache)."""

    def __init__(self, core: Core[S], size_of: Callable[[Document], int], limit: int) -> None:
        self.core = core
        self._size_of = size_of
        self._limit = limit

    def handle_batch(
        self, aggregate_id: AggregateId, items: Sequence[Item[S]]
    ) -> Flow[BatchOutcome[S]]:
        check_aggregate_id(aggregate_id)
        config = self.core.config
        retry = config.retry
        results: list[Outcome[S] | Failed | None] = [None] * len(items)
        #: IDs applied earlier in this call: duplicates even once out of the window.
        seen: dict[str, int] = {}
        todo = list(range(len(items)))
        cached = self.core.cache.take(aggregate_id)
        doc, known = (cached[0], cached[1]) if cached is not None else (None, None)
        fresh = doc is None
        attempt = commits = writes = loads = version = 0
        started = config.timer()
        while todo:
            if fresh:
                known = None
                loads += 1
                try:
                    doc = yield Load(aggregate_id)
                except TransientStoreError as exc:
                    attempt += 1
                    late = self.core.transient(exc, started)
                    if attempt >= retry.max_attempts or late is not None:
                        self._fail(aggregate_id, items, todo, results, late or exc, seen, version)
                        break
                    yield Sleep(retry.delay(attempt, config.rng))
                    continue
                except DocOutboxError as exc:
                    self._fail(aggregate_id, items, todo, results, exc, seen, version)
                    break
            try:
                snapshot = (
                    None
                    if doc is None
                    else read_snapshot(doc, self.core.model, values=self.core.values)
                )
                version = snapshot.version if snapshot is not None else 0
            except DocOutboxError as exc:
                self._fail(aggregate_id, items, todo, results, exc, seen, version)
                break
            lookup = spill.lookup_many(
                config.inbox,
                doc,
                [items[i].message for i in todo if items[i].message.id not in seen],
            )
            if lookup is not None:
                try:
                    found = yield lookup
                except TransientStoreError as exc:  # retried like a failed load
                    attempt += 1
                    late = self.core.transient(exc, started)
                    if attempt >= retry.max_attempts or late is not None:
                        self._fail(aggregate_id, items, todo, results, late or exc, seen, version)
                        break
                    yield Sleep(retry.delay(attempt, config.rng))
                    fresh = True
                    continue
                except DocOutboxError as exc:
                    self._fail(aggregate_id, items, todo, results, exc, seen, version)
                    break
                for index in todo:
                    if items[index].message.id in found:
                        seen.setdefault(items[index].message.id, index)  # archived: processed
            chunk = self._chunk(aggregate_id, snapshot, items, todo, seen, attempt)
            if not chunk.steps:
                self._settle(chunk, results, todo, items, seen)
                if doc is not None:
                    self.core.cache.put(aggregate_id, doc, known)
                    fresh = False
                continue
            base = doc if doc is not None else self._new(aggregate_id)
            try:
                for step in chunk.steps:  # large payloads put before the commit
                    step.plan = yield from self.core.claim(step.plan)
            except DocOutboxError as exc:
                self._fail(aggregate_id, items, todo, results, exc, seen, version)
                break
            try:
                plan, after, size = self._fit(aggregate_id, base, chunk, known)
            except DocumentTooLarge as exc:
                if not fresh:
                    fresh = True  # a cached copy may hold entries trimmed since: reload
                    continue
                first = chunk.steps[0].index
                chunk.others[first] = Failed(aggregate_id, items[first].message.id, exc)
                chunk.steps = []
                chunk.covered = [i for i in chunk.covered if i <= first]
                self._settle(chunk, results, todo, items, seen)
                continue
            attempt += 1
            writes += 1
            try:
                applied, plan = yield from spill.commit_steps(
                    plan, Write, None if doc is not None else InsertPlan(aggregate_id, after)
                )
                after = spill.written(after, plan)
            except TransientStoreError as exc:
                # The write may or may not have happened: reload and let the inbox decide.
                late = self.core.transient(exc, started)
                if late is not None:
                    self._fail(aggregate_id, items, todo, results, late, seen, version)
                    break
                if attempt >= retry.max_attempts:
                    yield from self._read_back(
                        aggregate_id, items, todo, results, seen, exc, attempt
                    )
                    break
                applied = False
            except DocOutboxError as exc:
                self._fail(aggregate_id, items, todo, results, exc, seen, version)
                break
            if applied:
                commits += 1
                self.core.cache.put(aggregate_id, after, size)
                for step in chunk.steps:
                    chunk.others[step.index] = Outcome(
                        Status.APPLIED,
                        aggregate_id,
                        after["version"],
                        attempt,
                        step.state,
                        tuple(step.entries),
                        step.cancelled,
                    )
                self._settle(chunk, results, todo, items, seen)
                doc, known, fresh, attempt = after, size, False, 0
                continue
            if attempt >= retry.max_attempts:
                # The conflict may be a resend of this very write that had applied.
                yield from self._read_back(aggregate_id, items, todo, results, seen, None, attempt)
                break
            if fresh:
                yield Sleep(retry.delay(attempt, config.rng))
            fresh = True
        final = tuple(r for r in results if r is not None)
        assert len(final) == len(items)
        return BatchOutcome(aggregate_id, final, commits, writes, loads)

    def _chunk(
        self,
        aggregate_id: AggregateId,
        snapshot: Snapshot[S] | None,
        items: Sequence[Item[S]],
        todo: list[int],
        seen: dict[str, int],
        attempt: int,
    ) -> _Chunk[S]:
        """Run the handlers of the next messages on the evolving state (pure)."""
        policy = self.core.config.inbox
        chunk: _Chunk[S] = _Chunk([], {}, [])
        current = snapshot
        version = snapshot.version if snapshot is not None else 0
        ids = 0
        for index in todo:
            item = items[index]
            msg = item.message
            windowed = policy.window > 0 and not uses_marks(policy, msg)
            if windowed and ids >= policy.window:
                break
            chunk.covered.append(index)
            if windowed and msg.id in seen:
                chunk.others[index] = Outcome(Status.DUPLICATE, aggregate_id, version, attempt)
                continue
            if current is None:
                if not item.create:
                    chunk.others[index] = Failed(
                        aggregate_id,
                        msg.id,
                        NotFound(f"{self.core.aggregate_type} {aggregate_id!r} does not exist"),
                    )
                    continue
                current = read_snapshot(
                    self._new(aggregate_id), self.core.model, values=self.core.values
                )
            if is_duplicate(policy, current.inbox, current.marks, msg) or (
                # A spilling window keeps what the chunk pushes out of it (the commit
                # archives it): stored at the chunk's start, processed for good.
                windowed and policy.spill and snapshot is not None and msg.id in snapshot.inbox
            ):
                chunk.others[index] = Outcome(Status.DUPLICATE, aggregate_id, version, attempt)
                if windowed and snapshot is not None and msg.id in snapshot.inbox:
                    seen[msg.id] = index  # stored, hence final: it may leave the window
                continue
            try:
                decision = self.core.decide(
                    item.handler, item.contextual, aggregate_id, current.state, msg, current
                )
                plan, entries = self._plan(current, msg, decision)
            except Exception as exc:  # noqa: BLE001 - a handler's failure belongs to its message
                chunk.others[index] = Failed(aggregate_id, msg.id, exc)
                continue
            keys = cancelled_keys(current, plan) if plan.cancel_ids else ()
            chunk.steps.append(_Step(index, plan, entries, decision.state, keys))
            current = _advance(current, plan, decision.state)
            if windowed:
                ids += 1
        return chunk

    def _plan(
        self, snapshot: Snapshot[S], message: Message, decision: Decision[S]
    ) -> tuple[CommitPlan, list[dict[str, Any]]]:
        config = self.core.config
        # The store's own check of a handler's state: exactly the model, storable, and
        # readable back; its stored form then goes into the plan.
        extra: dict[str, Any] = {}
        extra["state"], _ = self.core._state_document(decision.state, InvalidHandlerResult)
        try:
            plan, entries = plan_commit(
                snapshot,
                message,
                decision,
                policy=config.inbox,
                now=config.clock(),
                deterministic_ids=config.deterministic_ids,
                **extra,
            )
            return self.core.seal(plan), entries
        except PydanticSerializationError as exc:
            raise InvalidPayload(f"state of {snapshot.aggregate_id!r} does not serialize") from exc

    def _fit(
        self, aggregate_id: AggregateId, base: Document, chunk: _Chunk[S], known: int | None
    ) -> tuple[CommitPlan, Document, int]:
        """The commit of the longest prefix of the chunk that fits, the document after it,
        and its size.

        Cuts ``chunk`` back to that prefix; raises DocumentTooLarge when not even its first
        applied message fits. A spilling inbox spills what leaves the window, and, before
        a prefix is cut, every ID but the commit's own (:mod:`docoutbox.store.spill`).
        """
        policy = self.core.config.inbox
        steps = chunk.steps
        keep = len(steps)
        while True:
            merged = merge_plans([step.plan for step in steps[:keep]])
            plan = spill.plan_spill(merged, base, policy)
            after = apply_plan(base, plan)
            assert after is not None
            size = self._measure(after, plan, known)
            if size > self._limit and policy.spill:
                plan = spill.plan_spill(merged, base, policy, everything=True)
                after = apply_plan(base, plan)
                assert after is not None
                size = self._measure(after, plan, None)
            if size <= self._limit:
                break
            if keep == 1:
                raise DocumentTooLarge(aggregate_id, size, self._limit)
            keep = max(1, keep // 2)
        if keep < len(steps):
            last = steps[keep - 1].index
            chunk.steps = steps[:keep]
            chunk.covered = [i for i in chunk.covered if i <= last]
            chunk.others = {i: r for i, r in chunk.others.items() if i <= last}
        return plan, after, size

    def _measure(self, after: Document, plan: CommitPlan, known: int | None) -> int:
        """An upper bound of ``after``'s size: cheap from a known size, else measured."""
        if known is not None:
            added = {
                "s": plan.state,
                "o": list(plan.outbox_push),
                "i": list(plan.inbox_push),
                "m": list(plan.inbox_marks or ()),
            }
            slack = 64 + 8 * (len(plan.outbox_push) + len(plan.inbox_push))
            if plan.inbox_spill is not None:
                added["x"] = plan.inbox_spill
                slack += spill.SLACK
            bound = known + self._size_of(added) + slack
            if bound <= self._limit:
                return bound
        # A spill's token is set after the measure: its room is reserved here.
        return self._size_of(after) + (spill.SLACK if plan.inbox_spill is not None else 0)

    def _new(self, aggregate_id: AggregateId) -> Document:
        try:
            state = self.core.model().model_dump(mode="json")
        except PydanticSerializationError as exc:
            raise InvalidPayload(f"{self.core.model.__name__} does not serialize") from exc
        return self.core.new_document(aggregate_id, state)

    @staticmethod
    def _settle(
        chunk: _Chunk[S],
        results: list[Outcome[S] | Failed | None],
        todo: list[int],
        items: Sequence[Item[S]],
        seen: dict[str, int],
    ) -> None:
        """Make the chunk's results final (its write applied, or it needed none)."""
        for index in chunk.covered:
            result = results[index] = chunk.others[index]
            if result.applied or result.duplicate:
                # Processed for good, even once it leaves the window in a later commit.
                seen[items[index].message.id] = index
        done = set(chunk.covered)
        todo[:] = [i for i in todo if i not in done]

    def _read_back(
        self,
        aggregate_id: AggregateId,
        items: Sequence[Item[S]],
        todo: list[int],
        results: list[Outcome[S] | Failed | None],
        seen: dict[str, int],
        error: TransientStoreError | None,
        attempt: int,
    ) -> Flow[None]:
        """End the call after a write in doubt with no attempt left (a lost reply, ``error``,
        or a conflict, which may be a resend of the write itself): the document says what
        landed. Its inbox's messages are duplicates; the others failed with ``error``, or
        gave up after a conflict."""
        try:
            doc = yield Load(aggregate_id)
            snapshot = (
                None
                if doc is None
                else read_snapshot(doc, self.core.model, values=self.core.values)
            )
        except DocOutboxError as exc:
            self._fail(aggregate_id, items, todo, results, exc, seen, 0)
            return
        version = snapshot.version if snapshot is not None else 0
        policy = self.core.config.inbox
        for index in todo:
            message = items[index].message
            if snapshot is not None and is_duplicate(
                policy, snapshot.inbox, snapshot.marks, message
            ):
                results[index] = Outcome(Status.DUPLICATE, aggregate_id, version, attempt)
                seen[message.id] = index
            elif (done := self._processed(aggregate_id, items, index, seen, version)) is not None:
                results[index] = done
            elif error is not None:
                results[index] = Failed(aggregate_id, message.id, error)
            else:
                results[index] = Outcome(Status.GAVE_UP, aggregate_id, version, attempt)
        todo.clear()

    @staticmethod
    def _fail(
        aggregate_id: AggregateId,
        items: Sequence[Item[S]],
        todo: list[int],
        results: list[Outcome[S] | Failed | None],
        error: Exception,
        seen: dict[str, int],
        version: int,
    ) -> None:
        """End the call: what is not known processed gets ``error``."""
        for index in todo:
            failed = Failed(aggregate_id, items[index].message.id, error)
            done = BatchCore._processed(aggregate_id, items, index, seen, version)
            results[index] = done or failed
        todo.clear()

    @staticmethod
    def _processed(
        aggregate_id: AggregateId,
        items: Sequence[Item[S]],
        index: int,
        seen: dict[str, int],
        version: int,
    ) -> Outcome[S] | None:
        """A DUPLICATE outcome for a message this call already knows processed (a second
        copy in the batch, or one found in the stored inbox): never report it failed, or
        its redelivery could come back after it has left the window."""
        if items[index].message.id not in seen:
            return None
        return Outcome(Status.DUPLICATE, aggregate_id, version, 0)
