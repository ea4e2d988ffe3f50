"""Trims written behind the publishes (:mod:`docoutbox.dispatch.engine.deferred`): coalesced
per aggregate, due after a delay or at half the bound, refused past the bound, kept on
failure, and a request complete only once the trims of its run are written (I5)."""

from __future__ import annotations

import contextlib
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.operations import Ports
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.deferred import DeferredTrims
from docoutbox.dispatch.engine.flow import DispatchPolicy, Publish
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig, TrimRound
from docoutbox.drive import drive
from docoutbox.errors import InvalidConfig, TransientStoreError
from docoutbox.store.core import Write
from docoutbox.store.document import REVISION
from docoutbox.store.plans import TrimPlan, plan_trim
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints


def trims(delay: float = 1.0, limit: int = 10) -> DeferredTrims:
    return DeferredTrims(delay=delay, limit=limit)


def test_the_trims_of_one_aggregate_are_coalesced_into_one_plan() -> None:
    deferred = trims()
    assert deferred.add(plan_trim("a", ["a1", "a2"]), 1, 0, 0.0)
    assert deferred.add(plan_trim("b", ["b1"]), 2, 0, 0.0)
    assert deferred.add(plan_trim("a", ["a3"]), 3, 1, 0.0)
    assert deferred.untrimmed() == 4
    plans = {plan.aggregate_id: plan.entry_ids for plan in deferred.take()}
    assert plans == {"a": ("a1", "a2", "a3"), "b": ("b1",)}
    assert deferred.take() == []  # being written: not handed out twice


def test_a_single_plan_keeps_its_position_hints_and_a_merged_one_drops_them() -> None:
    deferred = trims()
    alone = plan_trim("a", ["a1"], ["a1", "a2"], "rev-1")
    deferred.add(alone, 1, 0, 0.0)
    deferred.add(plan_trim("b", ["b1"], ["b1"], "rev-2"), 2, 0, 0.0)
    deferred.add(plan_trim("b", ["b2"], ["b2"], "rev-3"), 3, 2, 0.0)
    plans = {plan.aggregate_id: plan for plan in deferred.take()}
    assert plans["a"] is alone
    assert plans["b"].outbox is None and plans["b"].revision is None


def test_a_merged_plan_aims_at_the_stored_order_of_the_latest_copy_read() -> None:
    # A busy aggregate on Cosmos DB: without a position hint, each coalesced trim would
    # read the item before patching it (two requests instead of one).
    deferred = trims()
    deferred.add(plan_trim("a", ["a1"], ["a1"], "rev-1"), 1, 0, 0.0)
    copy = {"_id": "a", "outbox": [{"id": "a1"}, {"id": "a2"}, {"id": "a3"}]}
    fresh = deferred.unpublished(copy)  # the next read: a1 still waits for its trim
    assert fresh is not None and [e["id"] for e in fresh["outbox"]] == ["a2", "a3"]
    deferred.add(plan_trim("a", ["a2"], ["a2", "a3"]), 2, 1, 0.0)
    (plan,) = deferred.take()
    assert plan.entry_ids == ("a1", "a2")
    assert plan.outbox == ("a1", "a2", "a3") and plan.revision is None


def test_a_trim_that_would_pass_the_bound_is_refused_and_left_to_its_run() -> None:
    deferred = trims(limit=3)
    assert deferred.add(plan_trim("a", ["a1", "a2"]), 1, 0, 0.0)
    assert not deferred.add(plan_trim("b", ["b1", "b2"]), 2, 0, 0.0)
    assert deferred.add(plan_trim("b", ["b1"]), 2, 0, 0.0)
    assert deferred.untrimmed() == 3
    assert not deferred.holds("c") and deferred.holds("b")


def test_a_flush_is_due_after_the_delay_or_once_half_the_bound_waits() -> None:
    deferred = trims(delay=1.0, limit=10)
    assert not deferred.due(5.0) and deferred.next_due(5.0) is None
    deferred.add(plan_trim("a", ["a1"]), 1, 0, 0.0)
    assert not deferred.due(0.99)
    assert deferred.next_due(0.25) == 0.75
    assert deferred.due(1.0)
    deferred.add(plan_trim("b", ["b1", "b2", "b3", "b4"]), 2, 0, 0.1)
    assert deferred.due(0.2)  # five of ten wait
    first, second = deferred.take()
    deferred.add(plan_trim("c", ["c1"]), 3, 0, 0.2)
    assert deferred.next_due(0.5) is None  # the flush under way wakes the driver
    deferred.written(first, True, 0.3)
    assert deferred.next_due(0.5) is None
    deferred.written(second, True, 0.4)
    assert deferred.next_due(0.5) == 0.7  # c's trim, handed over at 0.2


def test_a_failed_flush_leaves_its_entries_waiting_for_the_next_one() -> None:
    deferred = trims(delay=1.0)
    deferred.add(plan_trim("a", ["a1", "a2"]), 1, 0, 0.0)
    [plan] = deferred.take()
    deferred.written(plan, TransientStoreError("down"), 5.0)
    assert deferred.untrimmed() == 2 and deferred.holds("a")
    assert not deferred.settled("a", 1)
    assert not deferred.due(5.5) and deferred.due(6.0)  # waits the delay again
    [again] = deferred.take()
    assert again.entry_ids == ("a1", "a2")
    deferred.written(again, True, 6.0)
    assert deferred.untrimmed() == 0 and not deferred.holds("a")
    assert deferred.settled("a", 1)


def test_entries_handed_over_again_while_being_written_are_counted_once() -> None:
    deferred = trims()
    deferred.add(plan_trim("a", ["a1"]), 1, 0, 0.0)
    [first] = deferred.take()
    deferred.add(plan_trim("a", ["a1", "a2"]), 2, 1, 0.0)
    deferred.written(first, TransientStoreError("down"), 1.0)
    assert deferred.untrimmed() == 2
    [second] = deferred.take()
    assert second.entry_ids == ("a1", "a2")
    deferred.written(second, False, 2.0)  # False: the document is gone; nothing to retry
    assert deferred.untrimmed() == 0


def test_a_request_is_settled_only_once_the_trims_of_its_run_are_written() -> None:
    deferred = trims()
    deferred.add(plan_trim("a", ["a1"]), 5, 3, 0.0)
    assert deferred.settled("a", 3)  # completed before this run began
    assert not deferred.settled("a", 4) and not deferred.settled("a", 5)
    deferred.finished("a", 5)
    [plan] = deferred.take()
    assert not deferred.settled("a", 5)
    deferred.written(plan, True, 1.0)
    assert deferred.settled("a", 5)
    assert deferred.settled("b", 9)  # nothing deferred


def test_a_run_that_found_its_entries_waiting_settles_with_their_flush() -> None:
    deferred = trims()
    deferred.add(plan_trim("a", ["a1"]), 1, 0, 0.0)
    [plan] = deferred.take()
    deferred.finished("a", 2)  # run 2 skipped a1 (being written) and added nothing
    assert not deferred.settled("a", 2)
    deferred.written(plan, True, 1.0)
    assert deferred.settled("a", 2)
    deferred.add(plan_trim("a", ["a2"]), 3, 2, 1.0)
    deferred.finished("a", 4)  # run 4 skipped a2 (waiting)
    [plan] = deferred.take()
    deferred.written(plan, True, 2.0)
    assert deferred.settled("a", 4)


def test_a_run_with_nothing_waiting_settles_as_it_finishes() -> None:
    deferred = trims()
    deferred.add(plan_trim("a", ["a1"]), 1, 0, 0.0)
    deferred.finished("a", 1)
    [plan] = deferred.take()
    deferred.written(plan, TransientStoreError("down"), 1.0)
    [plan] = deferred.take()
    deferred.written(plan, True, 2.0)
    deferred.finished("a", 7)  # nothing waits: no state kept for it
    assert deferred.settled("a", 7) and not deferred.holds("a")


def test_a_hot_aggregate_never_holds_back_a_request_already_settled() -> None:
    """Each flush is followed by new trims of the aggregate: a request settled by an
    earlier flush stays settled (the checkpoint must not wait for a quiet moment)."""
    deferred = trims()
    deferred.add(plan_trim("a", ["a1"]), 1, 0, 0.0)
    deferred.finished("a", 1)
    [plan] = deferred.take()
    deferred.written(plan, True, 1.0)
    deferred.add(plan_trim("a", ["a2"]), 3, 1, 1.0)  # run 3 began after 1 completed
    assert deferred.settled("a", 1)
    assert not deferred.settled("a", 2)


def test_entries_waiting_or_being_written_are_left_out_of_copies() -> None:
    deferred = trims()
    doc = {
        "_id": "a",
        REVISION: "rev",
        "outbox": [{"id": "a1"}, {"id": "a2"}, {"id": "a3"}],
    }
    assert deferred.unpublished(doc) is doc
    assert deferred.unpublished(None) is None
    deferred.add(plan_trim("a", ["a1"]), 1, 0, 0.0)
    deferred.take()
    deferred.add(plan_trim("a", ["a2"]), 2, 1, 0.0)
    fresh = deferred.unpublished(doc)
    assert fresh is not None
    assert fresh["outbox"] == [{"id": "a3"}]
    assert REVISION not in fresh  # the revision no longer matches the copy
    assert deferred.unpublished({"_id": "b", "outbox": [{"id": "b1"}]}) == {
        "_id": "b",
        "outbox": [{"id": "b1"}],
    }


def test_the_options_are_checked() -> None:
    for bad in ({"trim_delay": -1.0}, {"max_untrimmed": 0}):
        try:
            DispatcherConfig(**bad)  # type: ignore[arg-type]
        except InvalidConfig:
            continue
        raise AssertionError(f"{bad} accepted")


# -- in the engine ---------------------------------------------------------------------


class World:
    def __init__(self, **options: Any) -> None:
        self.now = 0.0
        self.backend = MemoryBackend()
        self.store = AggregateStore(self.backend, Counter)
        self.publisher = MemoryPublisher()
        self.checkpoints = MemoryCheckpoints()
        self.ports = Ports(
            self.backend,
            self.publisher,
            MemoryDeadLetters(),
            MemoryChangeSource(self.backend),
            self.checkpoints,
        )
        self.engine = DispatchEngine(
            DispatcherConfig(name="d", checkpoint_interval=0, **options),
            SoleOwner(),
            stream=True,
            checkpoints=True,
            monotonic=lambda: self.now,
            clock=lambda: datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=self.now),
            rng=random.Random(0),
        )
        self.engine.begin()
        self.ops: list[Any] = []
        self.fail_trims = False

    def start(self, position: int = 0) -> None:
        """Resume at ``position`` and open the stream (the first turn does only that)."""
        self.checkpoints.save("d", position)
        drive(self.engine.turn(), self.perform)

    def perform(self, op: Any) -> Any:
        self.ops.append(op)
        if isinstance(op, TrimRound) and self.fail_trims:
            raise TransientStoreError("the trims failed")
        return self.ports.perform(op)

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        self.store.handle(
            aggregate, add_msg(message_id, emits=emits), counter_handlers, create=True
        )

    def step(self) -> None:
        drive(self.engine.turn(), self.perform)
        for slot in self.engine.start_runs():
            self.engine.finish(slot, drive(self.engine.run(slot), self.perform))
        drive(self.engine.checkpoint(self.now), self.perform)

    def pending(self) -> int:
        return sum(len(doc.get("outbox") or []) for doc in self.backend.docs.values())

    def flush(self) -> int:
        return drive(self.engine.flush_trims(), self.perform)


def test_a_run_publishes_without_trimming_and_the_checkpoint_waits_for_the_flush() -> None:
    world = World(trim_delay=1.0)
    world.start()
    world.write("a", "m1", emits=2)
    world.write("b", "m2")
    world.step()
    world.step()
    assert len(world.publisher.published) == 3
    assert not any(isinstance(op, Write | TrimRound) for op in world.ops)
    assert world.pending() == 3 and world.engine.trims_pending() == 3
    assert world.checkpoints.load("d") == 0  # I5: published, not yet trimmed
    assert not world.engine.trims_due()
    assert world.engine.deferred is not None
    assert world.engine.deferred.next_due(0.0) == 1.0
    assert world.engine.next_due() == 0.05  # the next poll comes first
    world.now = 1.0
    assert world.engine.trims_due()
    assert world.flush() == 2  # one plan per aggregate, in one round
    assert [len(op.plans) for op in world.ops if isinstance(op, TrimRound)] == [2]
    assert world.pending() == 0 and world.engine.trims_pending() == 0
    world.step()
    assert world.checkpoints.load("d") == len(world.backend.changes)


def test_a_copy_read_before_the_flush_does_not_publish_again() -> None:
    world = World(trim_delay=1.0)
    world.start()
    world.write("a", "m1")
    world.step()
    world.write("a", "m2")  # its event's copy still shows m1's entry, untrimmed
    world.step()
    assert [e.seq for e in world.publisher.published] == [1, 2]
    stale = world.backend.load("a")  # both entries, published, not trimmed
    world.now = 1.0
    world.flush()
    assert world.pending() == 0
    world.engine.request(stale)  # a copy read before the flush comes late
    world.step()
    assert [e.seq for e in world.publisher.published] == [1, 2]


def test_a_flush_during_a_run_settles_nothing_of_that_run() -> None:
    """The run's first trim is being written while it publishes its second entry: the
    request behind it is complete only once the second trim is written too."""
    world = World(trim_delay=1.0, policy=DispatchPolicy(trim_every=1))
    world.start()
    world.write("a", "m1", emits=2)
    drive(world.engine.turn(), world.perform)
    [slot] = world.engine.start_runs()
    run = world.engine.run(slot)
    op = next(run)
    while not isinstance(op, Publish):  # the document's load
        op = run.send(world.perform(op))
    assert op.entry.seq == 1
    op = run.send(world.perform(op))
    assert isinstance(op, Publish) and op.entry.seq == 2  # the first trim was deferred
    world.now = 1.0
    flush = world.engine.flush_trims()
    trims = next(flush)  # the first entry's trim is being written ...
    try:
        run.send(world.perform(op))  # ... as the run publishes the second and ends
    except StopIteration as stop:
        world.engine.finish(slot, stop.value)
    with contextlib.suppress(StopIteration):
        flush.send(world.perform(trims))
    drive(world.engine.checkpoint(world.now), world.perform)
    assert world.pending() == 1
    assert world.checkpoints.load("d") == 0  # I5: the second entry is not trimmed
    world.now = 2.0
    world.flush()
    world.step()
    assert world.pending() == 0
    assert world.checkpoints.load("d") == len(world.backend.changes)


def test_a_run_that_ended_before_a_flush_is_settled_by_it_while_later_trims_wait() -> None:
    """A hot aggregate: the next run's trims wait while the flush of the first's is
    written. The first request is complete once its own trims are written."""
    world = World(trim_delay=1.0)
    world.start()
    world.write("a", "m1")
    world.step()  # run 1 publishes m1's entry and ends
    world.now = 1.0
    flush = world.engine.flush_trims()
    trims = next(flush)
    world.write("a", "m2")
    world.step()  # run 2 publishes m2's entry and ends, its trim waiting
    with contextlib.suppress(StopIteration):
        flush.send(world.perform(trims))
    assert world.pending() == 1 and world.engine.trim_deferred("a")
    drive(world.engine.checkpoint(world.now), world.perform)
    assert world.checkpoints.load("d") == 1  # past m1's change, not m2's


def test_a_failed_flush_holds_the_checkpoint_and_the_next_one_trims() -> None:
    world = World(trim_delay=1.0)
    world.start()
    world.write("a", "m1")
    world.step()
    world.now = 1.0
    world.fail_trims = True
    assert world.flush() == 1
    assert world.pending() == 1 and world.engine.trims_pending() == 1
    world.step()
    assert world.checkpoints.load("d") == 0
    world.fail_trims = False
    world.now = 2.0
    world.flush()
    world.step()
    assert world.pending() == 0
    assert world.checkpoints.load("d") == len(world.backend.changes)
    assert len(world.publisher.published) == 1


def test_past_the_bound_a_run_writes_its_own_trim() -> None:
    world = World(trim_delay=1.0, max_untrimmed=1)
    world.start()
    world.write("a", "m1", emits=2)
    world.step()
    trims = [op.plan for op in world.ops if isinstance(op, Write)]
    assert [type(plan) for plan in trims] == [TrimPlan]
    assert world.pending() == 0 and world.engine.trims_pending() == 0
    assert any(isinstance(op, Publish) for op in world.ops)


def test_without_a_delay_each_run_trims_before_it_ends() -> None:
    world = World(trim_delay=0)
    world.start()
    world.write("a", "m1")
    world.step()
    assert world.pending() == 0
    assert not world.engine.trims_due() and world.flush() == 0
    world.step()  # reads the trim's own change
    assert world.checkpoints.load("d") == len(world.backend.changes)
