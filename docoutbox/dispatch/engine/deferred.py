"""Trims written behind the publishes: coalesced per aggregate, bounded in delay and count.

Rule 1 (off the publish path): a run hands the trim of what it published to
:class:`DeferredTrims` and goes on; the trims of an aggregate's runs are coalesced into one
plan, and every aggregate's pending plan goes out in one
:class:`~docoutbox.dispatch.engine.loop.TrimRound`, written by a flush of its own
(:meth:`DeferredTrims.take`, :meth:`DeferredTrims.written`).

Rule 2 (bounded delay): a flush is due once the oldest pending trim waited ``delay``
seconds, or once half the bound is pending. Every pending trim goes out with it.

Rule 3 (bounded backlog): at most ``limit`` published entries wait for their trim here. A
trim that would pass the bound is not deferred: its run writes it itself, as without
deferral (:meth:`DeferredTrims.add` says no). Each run also holds, as before, at most
``DispatchPolicy.trim_every`` published entries before it trims.

Rule 4 (a failed trim is not dropped): a flush that fails leaves its entries pending; they
go out with the next flush.

Rule 5 (I5 with deferred trims): an aggregate's run is *settled* once it finished and the
entries it published, and those it skipped as already published, are trimmed: a flush
that writes a run's first trims while the run goes on settles nothing of it. The event or sweep
request behind it is complete only then (:meth:`DeferredTrims.settled`), so the
checkpoint never passes a change whose entries are published but not yet trimmed: it
stays behind the oldest untrimmed change. A crash loses the pending trims; their entries
are still in the outboxes, behind the checkpoint, and are published again (I1, I6).

Rule 6 (no second publish from an older copy): the entries waiting here are left out of
every copy a run publishes from (:meth:`DeferredTrims.unpublished`), as the trimmed ones
are (:mod:`~docoutbox.dispatch.engine.trimmed`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from docoutbox.dispatch.engine.flow import stored_ids
from docoutbox.dispatch.engine.trimmed import without_entries
from docoutbox.model import AggregateId
from docoutbox.store.document import ID, Document
from docoutbox.store.plans import TrimPlan, plan_trim


@dataclass
class _Aggregate:
    """One aggregate's trims: those waiting for a flush, and those a flush is writing."""

    #: The highest run generation whose request is settled (every run below it, too).
    settled: int
    waiting: dict[str, None] = field(default_factory=dict)
    #: When the oldest waiting entry was handed over (``monotonic`` seconds).
    since: float = 0.0
    #: The highest generation of the runs that finished while trims of theirs (or
    #: entries they skipped as published) wait: a run still under way may add more.
    waiting_covers: int = 0
    #: The single plan waiting, if only one did (its hints stay true), else None.
    plan: TrimPlan | None = None
    #: The stored order of the outbox (entry IDs) in the latest copy read, held entries
    #: included: the position hint of a coalesced trim (a hint only: the store checks
    #: the IDs it finds there, and reads the document when they moved).
    order: tuple[str | None, ...] | None = None
    writing: tuple[str, ...] = ()
    writing_covers: int = 0

    def pending(self) -> bool:
        return bool(self.waiting or self.writing)


class DeferredTrims:
    """Published entries awaiting their trim, per aggregate; safe across threads."""

    def __init__(self, *, delay: float, limit: int) -> None:
        self.delay = delay
        self.limit = limit
        self._aggs: dict[AggregateId, _Aggregate] = {}
        self._untrimmed = 0
        #: Plans handed to the flush under way and not yet reported written.
        self._writing = 0
        self._lock = threading.Lock()

    def untrimmed(self) -> int:
        """Published entries whose trim is pending here (at most ``limit``)."""
        with self._lock:
            return self._untrimmed

    def add(self, plan: TrimPlan, generation: int, completed: int, now: float) -> bool:
        """Take over the trim ``plan`` of the run ``generation``: False (the run writes it
        itself) if it would pass the bound. ``completed``: the generation up to which the
        aggregate's requests were done when the run began."""
        with self._lock:
            agg = self._aggs.get(plan.aggregate_id)
            new = [i for i in plan.entry_ids if agg is None or i not in agg.waiting]
            if self._untrimmed + len(new) > self.limit:
                return False
            if agg is None:
                # Nothing of the aggregate waited: the runs that completed its requests so
                # far are settled. This one (still under way) is not, nor any after it.
                agg = self._aggs[plan.aggregate_id] = _Aggregate(settled=completed)
            if not agg.waiting:
                agg.since, agg.plan = now, plan
            else:
                agg.plan = None
            agg.waiting.update(dict.fromkeys(new))
            self._untrimmed += len(new)
            return True

    def holds(self, aggregate_id: AggregateId) -> bool:
        """Whether entries of the aggregate wait here for their trim."""
        with self._lock:
            agg = self._aggs.get(aggregate_id)
            return agg is not None and agg.pending()

    def finished(self, aggregate_id: AggregateId, generation: int) -> None:
        """The run ``generation`` succeeded: it is settled now if nothing of its aggregate
        waits for a trim, else once what waits is written."""
        with self._lock:
            agg = self._aggs.get(aggregate_id)
            if agg is None:
                return
            if agg.waiting:
                agg.waiting_covers = max(agg.waiting_covers, generation)
            elif agg.writing:
                agg.writing_covers = max(agg.writing_covers, generation)
            else:
                agg.settled = max(agg.settled, generation)

    def settled(self, aggregate_id: AggregateId, generation: int) -> bool:
        """Whether the aggregate's requests up to ``generation`` have every entry their
        runs published (or skipped as published) trimmed, so far as this instance
        deferred them."""
        with self._lock:
            agg = self._aggs.get(aggregate_id)
            return agg is None or not agg.pending() or agg.settled >= generation

    def due(self, now: float) -> bool:
        """Whether a flush should start now (Rule 2)."""
        with self._lock:
            if self._untrimmed * 2 >= self.limit:
                return any(agg.waiting for agg in self._aggs.values())
            return any(agg.waiting and now >= agg.since + self.delay for agg in self._aggs.values())

    def next_due(self, now: float) -> float | None:
        """Seconds until a flush is due, if anything waits for one and no flush is under
        way (its end wakes the driver)."""
        with self._lock:
            if self._writing:
                return None
            times = [agg.since + self.delay for agg in self._aggs.values() if agg.waiting]
        return None if not times else max(0.0, min(times) - now)

    def take(self) -> list[TrimPlan]:
        """Every waiting trim, one plan per aggregate, now being written (an aggregate
        whose previous flush is still being written waits for the next one)."""
        plans: list[TrimPlan] = []
        with self._lock:
            for aggregate_id, agg in self._aggs.items():
                if not agg.waiting or agg.writing:
                    continue
                ids = tuple(agg.waiting)
                plan = agg.plan if agg.plan is not None else plan_trim(aggregate_id, ids, agg.order)
                plans.append(plan)
                self._writing += 1
                agg.writing, agg.writing_covers = ids, agg.waiting_covers
                agg.waiting, agg.plan, agg.waiting_covers = {}, None, 0
        return plans

    def written(self, plan: TrimPlan, outcome: object, now: float) -> None:
        """The outcome of a plan of :meth:`take`: written (any result but an exception:
        False means the document is gone), or failed and waiting again (Rule 4)."""
        with self._lock:
            agg = self._aggs.get(plan.aggregate_id)
            if agg is None or not agg.writing:
                return
            self._writing -= 1
            ids, covers = agg.writing, agg.writing_covers
            agg.writing, agg.writing_covers = (), 0
            if isinstance(outcome, BaseException):
                again = {i: None for i in ids if i not in agg.waiting}
                self._untrimmed -= len(ids) - len(again)  # counted once, waiting once
                agg.waiting = again | agg.waiting
                agg.waiting_covers = max(agg.waiting_covers, covers)
                agg.plan = None
                agg.since = now
                return
            self._untrimmed -= len(ids)
            agg.settled = max(agg.settled, covers)
            if not agg.pending():
                del self._aggs[plan.aggregate_id]

    def unpublished(self, doc: Document | None) -> Document | None:
        """``doc`` without the entries waiting here for their trim (Rule 6)."""
        if doc is None:
            return None
        aggregate_id = doc.get(ID)
        if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
            return doc
        outbox = doc.get("outbox") or []
        with self._lock:
            agg = self._aggs.get(aggregate_id)
            if agg is None:
                return doc
            agg.order = tuple(stored_ids(doc))
            held = agg.waiting.keys() | set(agg.writing)
            skip = {e.get("id") for e in outbox if isinstance(e, dict) and e.get("id") in held}
        return without_entries(doc, outbox, skip)
