"""Runs in lockstep: a worker publishes several aggregates' entries in rounds (one entry per
aggregate, confirms in flight together), then trims them all in one round; one run's
failure neither stops nor fails the others."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import pytest

from docoutbox.dispatch.drivers.operations import GroupWriter
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.loop import DispatcherConfig, PublishRound, TrimRound
from docoutbox.dispatch.engine.scheduler import RunOutcome
from docoutbox.drive import Abandoned, drive
from docoutbox.errors import (
    BrokerUnavailable,
    InvalidConfig,
    PublishError,
    TransientStoreError,
)
from docoutbox.store.core import Write
from docoutbox.store.plans import WritePlan, plan_trim
from tests.support.engines import doc, engine_with


class CountingOwner(SoleOwner):
    def __init__(self) -> None:
        super().__init__()
        self.inside = 0

    def enter(self, partition: int) -> bool:
        self.inside += 1
        return True

    def leave(self, partition: int) -> None:
        self.inside -= 1


class Recorder:
    """Performs a batch's operations: publishes succeed unless told otherwise; each trim
    round answers with ``trim_outcomes`` (default: every trim applied)."""

    def __init__(self, fail_publish: str | None = None, trim_error: str | None = None) -> None:
        self.ops: list[str] = []
        self.rounds: list[list[str]] = []
        self.fail_publish = fail_publish
        self.trim_error = trim_error

    def __call__(self, op: Any) -> Any:
        if isinstance(op, PublishRound):
            self.ops.append(f"publish {' '.join(e.id for e in op.entries)}")
            return [
                RuntimeError("a bug in the publisher")
                if e.aggregate_id == self.fail_publish
                else None
                for e in op.entries
            ]
        if isinstance(op, TrimRound):
            ids = [plan.aggregate_id for plan in op.plans]
            self.ops.append(f"trim {ids}")
            self.rounds.append([str(i) for i in ids])
            return [TransientStoreError("refused") if i == self.trim_error else True for i in ids]
        raise AssertionError(f"unexpected {op!r}")


def test_runs_publish_in_rounds_of_one_entry_each_then_trim_together() -> None:
    engine = engine_with(doc("a", 2), doc("b", 1), doc("c", 3))
    slots = engine.start_runs()
    perform = Recorder()
    outcomes = drive(engine.run_batch(slots), perform)
    assert outcomes == [RunOutcome.DONE] * 3
    assert perform.ops == [
        "publish a-1 b-1 c-1",
        "publish a-2 c-2",
        "publish c-3",
        "trim ['a', 'b', 'c']",
    ]
    # What was trimmed is remembered: a stale copy publishes nothing again.
    assert engine._unpublished(doc("b")) == {**doc("b"), "outbox": []}


def test_a_trim_every_n_entries_is_a_round_of_its_own() -> None:
    config = DispatcherConfig(name="b", policy=DispatchPolicy(trim_every=2), trim_delay=0)
    engine = engine_with(doc("a", 3), doc("b", 1), config=config)
    perform = Recorder()
    assert drive(engine.run_batch(engine.start_runs()), perform) == [RunOutcome.DONE] * 2
    # a trims after two entries; b's trim waits for that round, then a's last one.
    assert perform.rounds == [["a", "b"], ["a"]]


def test_one_failed_trim_retries_its_aggregate_only() -> None:
    engine = engine_with(doc("a"), doc("b"))
    outcomes = drive(engine.run_batch(engine.start_runs()), Recorder(trim_error="a"))
    assert outcomes == [RunOutcome.RETRY, RunOutcome.DONE]


def test_an_unexpected_error_in_one_run_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = engine_with(doc("a"), doc("b"))
    perform = Recorder(fail_publish="a")
    outcomes = drive(engine.run_batch(engine.start_runs()), perform)
    assert outcomes == [RunOutcome.RETRY, RunOutcome.DONE]
    assert perform.rounds == [["b"]]
    assert "dispatch_run_failed aggregate='a'" in caplog.text


def test_an_abandoned_batch_leaves_every_partition_it_entered() -> None:
    owner = CountingOwner()
    engine = engine_with(doc("a"), doc("b"), ownership=owner)

    def crash_at_the_trims(op: Any) -> Any:
        if isinstance(op, TrimRound):
            assert owner.inside == 2
            raise Abandoned
        return [None] * len(op.entries) if isinstance(op, PublishRound) else None

    with pytest.raises(Abandoned):
        drive(engine.run_batch(engine.start_runs()), crash_at_the_trims)
    assert owner.inside == 0


def test_a_batch_of_one_run_yields_the_same_operations_as_the_run() -> None:
    def kinds(flow: Generator[Any, Any, Any]) -> list[str]:
        seen: list[str] = []

        def perform(op: Any) -> Any:
            seen.append(type(op).__name__)
            if isinstance(op, TrimRound):
                return [True] * len(op.plans)
            if isinstance(op, PublishRound):
                return [None] * len(op.entries)
            return True if isinstance(op, Write) else None

        drive(flow, perform)
        return seen

    one, other = engine_with(doc("a", 2)), engine_with(doc("a", 2))
    [slot] = one.start_runs()
    assert kinds(one.run(slot)) == ["Publish", "Publish", "Write"]
    assert kinds(other.run_batch(other.start_runs())) == [
        "PublishRound",
        "PublishRound",
        "TrimRound",
    ]


class Grouped:
    def __init__(self) -> None:
        self.rounds: list[int] = []

    def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
        self.rounds.append(len(plans))
        return [True] * len(plans)


def test_write_all_goes_out_in_one_round_and_answers_per_plan() -> None:
    backend = Grouped()
    writer = GroupWriter(backend)
    assert writer.write_all([plan_trim(a, ["e"]) for a in "abc"]) == [True, True, True]
    assert backend.rounds == [3]


@pytest.mark.parametrize("name", ["partitions", "concurrency", "run_batch", "batch_size"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "4"])
def test_counts_in_the_config_are_ints_of_at_least_one(name: str, value: object) -> None:
    with pytest.raises(InvalidConfig, match=f"DispatcherConfig.{name}"):
        DispatcherConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("partitions", 65_537),
        ("max_backlog", 0),
        ("max_outstanding", -1),
        ("sweep_interval", 0),
        ("sweep_interval", float("nan")),
        ("poll_interval", -0.1),
        ("poll_interval", 1e300),
        ("grace", float("inf")),
        ("grace", "30"),
        ("checkpoint_interval", -1),
    ],
)
def test_the_configs_other_settings_are_checked(name: str, value: object) -> None:
    with pytest.raises(InvalidConfig, match=f"DispatcherConfig.{name}"):
        DispatcherConfig(**{name: value})  # type: ignore[arg-type]


def test_a_trim_round_that_fails_as_a_whole_retries_each_of_its_runs() -> None:
    engine = engine_with(doc("a"), doc("b"))

    def broken_round(op: Any) -> Any:
        if isinstance(op, TrimRound):
            raise TransientStoreError("the connection dropped")
        return [None] * len(op.entries) if isinstance(op, PublishRound) else None

    outcomes = drive(engine.run_batch(engine.start_runs()), broken_round)
    assert outcomes == [RunOutcome.RETRY, RunOutcome.RETRY]


def test_a_refused_entry_is_retried_before_its_aggregates_next_one_goes_out() -> None:
    """I4 with confirms in flight: a nack concerns its own run only, and the aggregate's
    next entry is sent only once the refused one is confirmed."""
    engine = engine_with(doc("a", 2), doc("b", 2))
    refused = {"a-1"}
    rounds: list[list[str]] = []

    def perform(op: Any) -> Any:
        if isinstance(op, PublishRound):
            rounds.append([e.id for e in op.entries])
            outcomes: list[Exception | None] = []
            for e in op.entries:
                outcomes.append(PublishError("nacked") if e.id in refused else None)
                refused.discard(e.id)
            return outcomes
        if isinstance(op, TrimRound):
            return [True] * len(op.plans)
        return True if isinstance(op, Write) else None  # the failure record; sleeps: None

    assert drive(engine.run_batch(engine.start_runs()), perform) == [RunOutcome.DONE] * 2
    assert rounds == [["a-1", "b-1"], ["a-1", "b-2"], ["a-2"]]


def test_a_round_that_fails_as_a_whole_fails_each_of_its_entries() -> None:
    engine = engine_with(doc("a"), doc("b"))

    def broken(op: Any) -> Any:
        if isinstance(op, PublishRound):
            raise BrokerUnavailable("connection lost")
        return [True] * len(op.plans) if isinstance(op, TrimRound) else None

    outcomes = drive(engine.run_batch(engine.start_runs()), broken)
    assert outcomes == [RunOutcome.UNAVAILABLE, RunOutcome.UNAVAILABLE]


#: Trims handed to the deferred trimmer: a run is over after its last publish.
DEFERRED_TRIMS = DispatcherConfig(name="b", trim_delay=5)


def test_a_run_is_finished_as_soon_as_it_is_over_not_when_its_batch_is() -> None:
    """With deferred trims a run is over after its last publish: its aggregate is free to
    run again (and to count for the checkpoint) while the batch's longer runs go on, and
    the driver's finish of the whole batch afterwards leaves it alone."""
    engine = engine_with(doc("a", 1), doc("b", 3), config=DEFERRED_TRIMS)
    slots = engine.start_runs()
    running: list[int] = []
    recorder = Recorder()

    def perform(op: Any) -> Any:
        running.append(engine.queue.running)
        return recorder(op)

    outcomes = drive(engine.run_batch(slots), perform)
    assert recorder.ops == ["publish a-1 b-1", "publish b-2", "publish b-3"]
    assert running == [2, 1, 1]  # a was finished once its one entry was confirmed
    assert engine.queue.running == 0
    engine.request(doc("a", 2))  # a's next run starts while the batch is not yet reported
    [again] = engine.start_runs()
    assert again.aggregate_id == "a"
    for slot, outcome in zip(slots, outcomes, strict=True):
        engine.finish(slot, outcome)  # the old run of a is not finished twice
    assert engine.queue.running == 1 and engine.queue.holds(again)


def test_a_batch_that_fails_after_a_run_is_over_retries_only_the_runs_not_over() -> None:
    engine = engine_with(doc("a", 1), doc("b", 2), config=DEFERRED_TRIMS)
    slots = engine.start_runs()
    calls = 0

    def perform(op: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise Abandoned  # the driver stops the batch after a's run is over
        return Recorder()(op)

    with pytest.raises(Abandoned):
        drive(engine.run_batch(slots), perform)
    assert engine.queue.running == 1  # a was finished done; b is still the driver's
    for slot in slots:
        engine.finish(slot, RunOutcome.STOPPED)
    assert engine.queue.running == 0
