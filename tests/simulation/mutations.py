"""Deliberate bugs, to prove the simulation can fail.

- ``inbox-off``: de-duplication never finds a message (``is_duplicate`` returns False);
- ``consumer-window-0``: consumers keep no inbox at all (a schedule setting, see
  :data:`tests.simulation.schedule.MUTATION_SETTINGS`);
- ``version-off``: a commit applies whatever the stored version (the memory store's
  ``apply_plan`` and the MongoDB ``commit_update`` filter lose their version guard);
- ``order-off``: the dispatcher publishes a document's entries newest first;
- ``outbox-overwrite``: a commit replaces the outbox instead of appending to it, dropping
  entries it did not publish (memory store);
- ``checkpoint-early``: the position tracker lets the checkpoint pass unfinished events;
- ``batch-first-state``: a batch's commit keeps the state after its first message instead
  of its last (consumers handle batches of 8, a schedule setting);
- ``inbox-oldest``: the inbox window keeps its oldest IDs instead of its newest (memory
  store; consumers keep a window of 2, a schedule setting, so it overflows);
- ``trim-first``: a trim removes only the first entry of its list (memory store);
- ``attempts-off``: the dispatcher quarantines after ``max_attempts + 1`` failed
  publishes instead of ``max_attempts``;
- ``trim-version``: a trim bumps the document's ``version`` (memory store), so it can
  fail a concurrent commit;
- ``run-ahead``: a publish round carries, behind each aggregate's entry, that
  aggregate's next two pending entries (confirms of one aggregate's run in flight
  together); a refused entry is then followed by accepted later ones;
- ``round-misattributed``: the outcomes of a publish round reach the runs in reverse
  order, so a run may take another aggregate's confirm for its own;
- ``trims-unsettled``: a request counts as complete once its run succeeded, whether or
  not the trims it deferred are written (I5 with deferred trims);
- ``trim-failure-dropped``: a deferred trim that fails is taken for written;
- ``trim-delay-off``: a flush of the deferred trims is due only once half the bound
  waits, never after the delay;
- ``untrimmed-unbounded``: a run defers its trim whatever the bound;
- ``settled-mid-run``: a flush settles the runs whose trims it writes, even one still
  under way, which may defer more trims after it.

Scheduled entries (schedules that schedule every command's effects, a setting):

- ``due-early``: a run takes every scheduled entry for due;
- ``trim-not-due``: a run trims the entries not yet due with those it published;
- ``hint-off``: no write sets the document's ``earliest_due`` (dispatchers that follow
  the change log, so only the due query finds an entry once due);
- ``cancel-off``: a commit's cancellations are not written (memory store);
- ``release-off``: a release ignores the entry's cancellation (memory store), so a copy
  read before a cancel committed is published anyway;
- ``seq-at-emit``: a scheduled entry takes its ``seq`` when it is emitted (and again when
  released), so a cancelled or renumbered one leaves a gap in the published seqs;
- ``release-version-off``: a release does not increment ``version`` (memory store), so a
  commit computed from the same ``outbox_seq`` gives its entry the released entry's seq.

The claim check, one mutation per rule (claim-checked schedules, a setting):

- ``claim-put-skipped``: a commit references payloads it never put (put before commit);
- ``claim-refresh-off``: a handle commits a reference to a put older than the fresh
  bound, which the sweep may have removed meanwhile (puts made again when slow);
- ``claim-unresolved``: the dispatcher publishes references instead of payloads;
- ``claim-missing-dropped``: a missing payload makes its entry malformed, quarantined and
  trimmed, instead of pending (never drop an unresolved entry);
- ``claim-delete-deferred``: a trim that frees payloads is deferred like any other, and
  the run deletes the payloads before that trim is written (delete only after the trim
  commits: such a trim is written by its run);
- ``claim-sweep-referenced``: the sweep deletes stale payloads whether or not a pending
  entry refers to them;
- ``claim-sweep-young``: the sweep deletes unreferenced payloads of any age (the grace);
- ``claim-dead-letter-inline``: a quarantined claim-checked entry is dead-lettered with
  its payload resolved, inline, instead of its reference;
- ``claim-dead-letter-deleted``: the payload of a quarantined claim-checked entry is
  deleted after the trim, as a published one's, and no dead letter is asked first,
  though its dead letter refers to it;
- ``claim-sweep-dead-letters-off``: the sweep reads the outbox only, not the dead
  letters, and deletes payloads that dead letters refer to.

Inbox spill-over (consumers spill a window of 2, a schedule setting):

- ``spill-after-commit``: a commit that spills writes the archive after the commit
  instead of before it, so a crash or a reader in between finds the IDs nowhere;
- ``spill-lookup-off``: a message missing from a spilled document's window is never
  looked up in the archive;
- ``spill-evicts``: a commit that spills archives nothing (the IDs are evicted, as
  without spill).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext, suppress
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from docoutbox.dispatch.engine import checkpoint as tracking
from docoutbox.dispatch.engine import deferred, loop
from docoutbox.dispatch.engine import flow as dispatch
from docoutbox.drive import drive
from docoutbox.errors import InvalidInput, PayloadMissing
from docoutbox.model import OutboxMessage
from docoutbox.store import batch, plans, spill
from docoutbox.store import core as flows
from docoutbox.store.core import Load
from docoutbox.store.document import Document
from docoutbox.store.plans import CommitPlan, ReleasePlan, TrimPlan, WritePlan, apply_plan
from docoutbox.stored import claim, sweep
from docoutbox.stored.reference import claim_of
from docoutbox.testing import memory


@contextmanager
def inbox_off() -> Iterator[None]:
    def never(*args: Any) -> bool:
        return False

    with mock.patch.object(flows, "is_duplicate", never):
        yield


@contextmanager
def version_off() -> Iterator[None]:
    def blind_apply(doc: Document | None, plan: WritePlan) -> Document | None:
        if isinstance(plan, CommitPlan) and doc is not None:
            plan = replace(plan, expected_version=int(doc["version"]))
        return apply_plan(doc, plan)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(memory, "apply_plan", blind_apply))
        try:
            from docoutbox_mongo import backend, plans
        except ImportError:  # pymongo absent: only the memory store can run
            pass
        else:
            commit_update = plans.commit_update

            def blind_update(plan: CommitPlan) -> tuple[dict[str, Any], dict[str, Any]]:
                query, update = commit_update(plan)
                return {k: v for k, v in query.items() if k != "version"}, update

            for module in (plans, backend):
                stack.enter_context(mock.patch.object(module, "commit_update", blind_update))
        yield


@contextmanager
def order_off() -> Iterator[None]:
    pending_entries = dispatch.pending_entries

    def newest_first(doc: Document) -> list[dict[str, Any]]:
        return pending_entries(doc)[::-1]

    with mock.patch.object(dispatch, "pending_entries", newest_first):
        yield


@contextmanager
def outbox_overwrite() -> Iterator[None]:
    def overwrite(doc: Document | None, plan: WritePlan) -> Document | None:
        after = apply_plan(doc, plan)
        if isinstance(plan, CommitPlan) and after is not None:
            after["outbox"] = list(plan.outbox_push)
        return after

    with mock.patch.object(memory, "apply_plan", overwrite):
        yield


@contextmanager
def checkpoint_early() -> Iterator[None]:
    def everything(done: Iterable[bool]) -> int:
        return len(list(done))

    with mock.patch.object(tracking, "checkpoint_after", everything):
        yield


@contextmanager
def batch_first_state() -> Iterator[None]:
    merge_plans = batch.merge_plans

    def first_state(plans: Sequence[CommitPlan]) -> CommitPlan:
        return replace(merge_plans(plans), state=plans[0].state)

    with mock.patch.object(batch, "merge_plans", first_state):
        yield


@contextmanager
def inbox_oldest() -> Iterator[None]:
    def oldest(doc: Document | None, plan: WritePlan) -> Document | None:
        after = apply_plan(doc, plan)
        if isinstance(plan, CommitPlan) and plan.inbox_push and doc is not None and after:
            after["inbox"] = [*doc.get("inbox", ()), *plan.inbox_push][: plan.inbox_window]
        return after

    with mock.patch.object(memory, "apply_plan", oldest):
        yield


@contextmanager
def trim_first() -> Iterator[None]:
    def first_only(doc: Document | None, plan: WritePlan) -> Document | None:
        if isinstance(plan, TrimPlan):
            plan = replace(plan, entry_ids=plan.entry_ids[:1])
        return apply_plan(doc, plan)

    with mock.patch.object(memory, "apply_plan", first_only):
        yield


@contextmanager
def attempts_off() -> Iterator[None]:
    publish_with_retries = dispatch._publish_with_retries

    def one_more(
        entry: Any, policy: dispatch.DispatchPolicy, rng: Any, *rest: Any
    ) -> Generator[Any, Any, str]:
        late = replace(policy, max_attempts=policy.max_attempts + 1)
        return (yield from publish_with_retries(entry, late, rng, *rest))

    with mock.patch.object(dispatch, "_publish_with_retries", one_more):
        yield


@contextmanager
def trim_version() -> Iterator[None]:
    def bump(doc: Document | None, plan: WritePlan) -> Document | None:
        after = apply_plan(doc, plan)
        if isinstance(plan, TrimPlan) and after is not None:
            after["version"] = int(after["version"]) + 1
        return after

    with mock.patch.object(memory, "apply_plan", bump):
        yield


#: The runs of a publish round (``_publish_round``'s ``publishes``); their entries come apart.
Publishes = list[Any]


@contextmanager
def run_ahead() -> Iterator[None]:
    pending: dict[Any, list[Any]] = {}
    dispatch_document = loop.dispatch_document

    def remembering(doc: Document, policy: Any, rng: Any, *rest: Any) -> Generator[Any, Any, Any]:
        pending[doc["_id"]] = dispatch.pending_entries(doc)
        return dispatch_document(doc, policy, rng, *rest)

    def later(entry: OutboxMessage) -> list[OutboxMessage]:
        found: list[OutboxMessage] = []
        for raw in pending.get(entry.aggregate_id, ()):
            try:
                other = OutboxMessage.parse(raw)
            except InvalidInput:
                continue
            if other.seq > entry.seq and len(found) < 2:
                found.append(other)
        return found

    def ahead(
        self: Any, publishes: Publishes, entries: list[OutboxMessage]
    ) -> Generator[Any, Any, None]:
        sent: list[OutboxMessage] = []
        mine: list[int] = []
        for entry in entries:
            mine.append(len(sent))
            sent.extend([entry, *later(entry)])
        try:
            outcomes = yield loop.PublishRound(tuple(sent))
        except Exception as exc:
            outcomes = [exc] * len(sent)
        for run, index in zip(publishes, mine, strict=True):
            outcome = outcomes[index]
            if outcome is None:
                run.reply(None)
            else:
                run.fail(outcome)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(loop, "dispatch_document", remembering))
        stack.enter_context(mock.patch.object(loop.DispatchEngine, "_publish_round", ahead))
        yield


@contextmanager
def round_misattributed() -> Iterator[None]:
    publish_round = loop.DispatchEngine._publish_round

    def reversed_outcomes(
        self: Any, publishes: Publishes, entries: list[OutboxMessage]
    ) -> Generator[Any, Any, None]:
        flow = publish_round(self, publishes, entries)
        op = next(flow)
        try:
            outcomes = yield op
        except Exception as exc:
            with suppress(StopIteration):
                flow.throw(exc)
            return
        with suppress(StopIteration):
            flow.send(list(reversed(outcomes)))

    with mock.patch.object(loop.DispatchEngine, "_publish_round", reversed_outcomes):
        yield


@contextmanager
def finished_before_over() -> Iterator[None]:
    """Each run of a batch reported done as its batch starts, before it has published."""
    run_batch = loop.DispatchEngine.run_batch

    def early(self: Any, slots: Any) -> Generator[Any, Any, Any]:
        for slot in slots:
            self.finish(slot, loop.RunOutcome.DONE)
        return (yield from run_batch(self, slots))

    with mock.patch.object(loop.DispatchEngine, "run_batch", early):
        yield


#: Later than any due time of a simulated schedule.
FAR = datetime(2100, 1, 1, tzinfo=UTC)


@contextmanager
def due_early() -> Iterator[None]:
    due_order = dispatch.due_order

    def everything_due(doc: Document, now: Any, *rest: Any) -> Any:
        return due_order(doc, FAR if now is not None else None, *rest)

    with mock.patch.object(dispatch, "due_order", everything_due):
        yield


@contextmanager
def trim_not_due() -> Iterator[None]:
    due_order = dispatch.due_order

    def dropping(doc: Document, now: Any, *rest: Any) -> Any:
        order = due_order(doc, now, *rest)
        sent = {e.get("id") for e in order.entries if isinstance(e, dict)}
        later = tuple(
            e["id"]
            for e in doc.get("outbox") or ()
            if e.get("due") is not None and e["id"] not in sent and e["id"] not in order.cancelled
        )
        return replace(order, cancelled=(*order.cancelled, *later))

    with mock.patch.object(dispatch, "due_order", dropping):
        yield


@contextmanager
def hint_off() -> Iterator[None]:
    schedule = plans._schedule

    def no_hint(*args: Any) -> tuple[tuple[str, ...], bool, Any]:
        cancel_ids, _, _ = schedule(*args)
        return cancel_ids, False, None

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(plans, "_schedule", no_hint))
        stack.enter_context(mock.patch.object(dispatch, "settle_plan", return_value=None))
        yield


@contextmanager
def cancel_off() -> Iterator[None]:
    def uncancelled(doc: Document | None, plan: WritePlan) -> Document | None:
        if isinstance(plan, CommitPlan) and plan.cancel_ids:
            plan = replace(plan, cancel_ids=())
        return apply_plan(doc, plan)

    with mock.patch.object(memory, "apply_plan", uncancelled):
        yield


@contextmanager
def release_off() -> Iterator[None]:
    def unguarded(doc: Document | None, plan: WritePlan) -> Document | None:
        if isinstance(plan, ReleasePlan) and doc is not None:
            kept = [i for i in doc.get("cancelled") or () if i != plan.entry_id]
            doc = {**doc, "cancelled": kept}
        return apply_plan(doc, plan)

    with mock.patch.object(memory, "apply_plan", unguarded):
        yield


@contextmanager
def seq_at_emit() -> Iterator[None]:
    seal = plans.seal

    def numbering(emits: Any, *, last_seq: int, **rest: Any) -> list[dict[str, Any]]:
        entries = seal(emits, last_seq=last_seq, **rest)
        return [{**e, "seq": last_seq + i} for i, e in enumerate(entries, start=1)]

    with mock.patch.object(plans, "seal", numbering):
        yield


@contextmanager
def release_version_off() -> Iterator[None]:
    def unversioned(doc: Document | None, plan: WritePlan) -> Document | None:
        after = apply_plan(doc, plan)
        if isinstance(plan, ReleasePlan) and after is not None and doc is not None:
            after["version"] = doc["version"]
        return after

    with mock.patch.object(memory, "apply_plan", unversioned):
        yield


@contextmanager
def trims_unsettled() -> Iterator[None]:
    def always(self: Any, aggregate_id: Any, generation: int) -> bool:
        return True

    with mock.patch.object(deferred.DeferredTrims, "settled", always):
        yield


@contextmanager
def trim_failure_dropped() -> Iterator[None]:
    written = deferred.DeferredTrims.written

    def as_written(self: Any, plan: TrimPlan, outcome: object, now: float) -> None:
        written(self, plan, False if isinstance(outcome, BaseException) else outcome, now)

    with mock.patch.object(deferred.DeferredTrims, "written", as_written):
        yield


@contextmanager
def trim_delay_off() -> Iterator[None]:
    def when_half_full(self: Any, now: float) -> bool:
        return self.untrimmed() * 2 >= self.limit

    with mock.patch.object(deferred.DeferredTrims, "due", when_half_full):
        yield


@contextmanager
def untrimmed_unbounded() -> Iterator[None]:
    add = deferred.DeferredTrims.add

    def unbounded(self: Any, plan: TrimPlan, generation: int, completed: int, now: float) -> bool:
        limit, self.limit = self.limit, 1_000_000
        try:
            return add(self, plan, generation, completed, now)
        finally:
            self.limit = limit

    with mock.patch.object(deferred.DeferredTrims, "add", unbounded):
        yield


@contextmanager
def settled_mid_run() -> Iterator[None]:
    add = deferred.DeferredTrims.add

    def settling(self: Any, plan: TrimPlan, generation: int, completed: int, now: float) -> bool:
        if not add(self, plan, generation, completed, now):
            return False
        agg = self._aggs[plan.aggregate_id]
        agg.waiting_covers = max(agg.waiting_covers, generation)
        return True

    with mock.patch.object(deferred.DeferredTrims, "add", settling):
        yield


@contextmanager
def claim_put_skipped() -> Iterator[None]:
    plan_claims = flows.claim_plan

    def unput(plan: CommitPlan, *args: Any) -> Generator[Any, Any, CommitPlan]:
        result: CommitPlan = drive(plan_claims(plan, *args), lambda op: None)  # none put
        return result
        yield  # a flow, as the one it stands for

    with mock.patch.object(flows, "claim_plan", unput):
        yield


@contextmanager
def claim_refresh_off() -> Iterator[None]:
    with mock.patch.object(claim, "fresh_bound", return_value=float("inf")):
        yield


@contextmanager
def claim_unresolved() -> Iterator[None]:
    document = dispatch.dispatch_document

    def unresolved(*args: Any, **kwargs: Any) -> Any:
        return document(*args[:5], True)  # references=True

    with mock.patch.object(loop, "dispatch_document", unresolved):
        yield


@contextmanager
def claim_missing_dropped() -> Iterator[None]:
    resolve = dispatch.resolve_stored

    def dropping(raw: dict[str, Any]) -> Generator[Any, Any, dict[str, Any]]:
        try:
            return (yield from resolve(raw))
        except PayloadMissing as exc:
            raise InvalidInput(f"a missing payload taken for a malformed entry: {exc}") from exc

    with mock.patch.object(dispatch, "resolve_stored", dropping):
        yield


@contextmanager
def claim_delete_deferred() -> Iterator[None]:
    # A trim that frees payloads no longer says so: it is deferred like any other, and
    # the run deletes the payloads before that trim is written.
    plan_trim = dispatch.plan_trim

    def unmarked(*args: Any) -> TrimPlan:
        return plan_trim(*args[:4])

    with mock.patch.object(dispatch, "plan_trim", unmarked):
        yield


@contextmanager
def claim_sweep_referenced() -> Iterator[None]:
    with mock.patch.object(sweep, "referenced", return_value=False):
        yield


@contextmanager
def claim_sweep_young() -> Iterator[None]:
    with mock.patch.object(sweep, "stale_before", lambda now, grace: now + timedelta(days=1)):
        yield


@contextmanager
def claim_dead_letter_inline() -> Iterator[None]:
    publish_with_retries = dispatch._publish_with_retries

    def resolved(
        entry: Any, policy: Any, rng: Any, stored: dict[str, Any] | None = None
    ) -> Generator[Any, Any, str]:
        if claim_of(stored) is not None:
            stored = None  # quarantined as published: the payload inline
        return (yield from publish_with_retries(entry, policy, rng, stored))

    with mock.patch.object(dispatch, "_publish_with_retries", resolved):
        yield


@contextmanager
def claim_dead_letter_deleted() -> Iterator[None]:
    publish_with_retries = dispatch._publish_with_retries

    def as_published(*args: Any) -> Generator[Any, Any, str]:
        outcome = yield from publish_with_retries(*args)
        return "published" if outcome == "quarantined" else outcome

    def delete_unasked(
        trimmed: list[str], claimed: dict[str, str], result: Any
    ) -> Generator[Any, Any, None]:
        ids = tuple(claimed[i] for i in trimmed if i in claimed)
        if ids:
            yield claim.DeletePayloads(ids)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(dispatch, "_publish_with_retries", as_published))
        stack.enter_context(mock.patch.object(dispatch, "_delete_payloads", delete_unasked))
        yield


@contextmanager
def claim_sweep_dead_letters_off() -> Iterator[None]:
    def outbox_only(info: Any) -> Generator[Any, Any, bool]:
        return sweep.referenced((yield Load(info.aggregate_id)), info.payload_id)

    with mock.patch.object(sweep, "_held", outbox_only):
        yield


@contextmanager
def spill_after_commit() -> Iterator[None]:
    def commit_then_archive(
        plan: CommitPlan, write: Callable[[WritePlan], Any], insert: Any = None
    ) -> Generator[Any, Any, tuple[bool, CommitPlan]]:
        applied: bool = yield write(plan if insert is None else insert)
        if plan.inbox_spilled:
            yield spill.Archive(plan.aggregate_id, plan.inbox_spilled)
        return applied, plan

    with mock.patch.object(spill, "commit_steps", commit_then_archive):
        yield


@contextmanager
def spill_lookup_off() -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(spill, "lookup", return_value=None))
        stack.enter_context(mock.patch.object(spill, "lookup_many", return_value=None))
        yield


@contextmanager
def spill_evicts() -> Iterator[None]:
    def evicting(
        plan: CommitPlan, write: Callable[[WritePlan], Any], insert: Any = None
    ) -> Generator[Any, Any, tuple[bool, CommitPlan]]:
        applied: bool = yield write(plan if insert is None else insert)
        return applied, plan

    with mock.patch.object(spill, "commit_steps", evicting):
        yield


MUTATIONS: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "inbox-off": inbox_off,
    "consumer-window-0": nullcontext,
    "version-off": version_off,
    "order-off": order_off,
    "outbox-overwrite": outbox_overwrite,
    "checkpoint-early": checkpoint_early,
    "batch-first-state": batch_first_state,
    "inbox-oldest": inbox_oldest,
    "trim-first": trim_first,
    "attempts-off": attempts_off,
    "trim-version": trim_version,
    "run-ahead": run_ahead,
    "round-misattributed": round_misattributed,
    "finished-before-over": finished_before_over,
    "due-early": due_early,
    "trim-not-due": trim_not_due,
    "hint-off": hint_off,
    "cancel-off": cancel_off,
    "release-off": release_off,
    "seq-at-emit": seq_at_emit,
    "release-version-off": release_version_off,
    "trims-unsettled": trims_unsettled,
    "trim-failure-dropped": trim_failure_dropped,
    "trim-delay-off": trim_delay_off,
    "untrimmed-unbounded": untrimmed_unbounded,
    "settled-mid-run": settled_mid_run,
    "claim-put-skipped": claim_put_skipped,
    "claim-refresh-off": claim_refresh_off,
    "claim-unresolved": claim_unresolved,
    "claim-missing-dropped": claim_missing_dropped,
    "claim-delete-deferred": claim_delete_deferred,
    "claim-sweep-referenced": claim_sweep_referenced,
    "claim-sweep-young": claim_sweep_young,
    "claim-dead-letter-inline": claim_dead_letter_inline,
    "claim-dead-letter-deleted": claim_dead_letter_deleted,
    "claim-sweep-dead-letters-off": claim_sweep_dead_letters_off,
    "spill-after-commit": spill_after_commit,
    "spill-lookup-off": spill_lookup_off,
    "spill-evicts": spill_evicts,
}


def applied(name: str | None) -> AbstractContextManager[Any]:
    if name is None:
        return nullcontext()
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; expected one of {sorted(MUTATIONS)}")
    return MUTATIONS[name]()
