"""Runs dealt to workers: packed at up to ``run_batch`` per worker when the engine publishes
in rounds (fewer, larger rounds), spread over every free worker when it does not; a lone
run never waits for company."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from docoutbox.dispatch.engine.batching import deal
from docoutbox.dispatch.engine.loop import DispatchEngine, PublishRound, TrimRound
from docoutbox.dispatch.engine.scheduler import RunOutcome
from docoutbox.drive import drive
from docoutbox.errors import InvalidConfig
from tests.support.engines import doc, engine_with


def sizes(batches: list[list[int]]) -> list[int]:
    return sorted((len(b) for b in batches), reverse=True)


def test_with_rounds_runs_are_packed_up_to_run_batch_per_worker() -> None:
    runs = list(range(200))
    # 200 aggregates, 32 free workers, 16 runs per worker: 13 workers, not 32.
    assert sizes(deal(runs, 32, 16, rounds=True)) == [16] * 5 + [15] * 8
    assert sizes(deal(runs[:16], 32, 16, rounds=True)) == [16]
    assert sizes(deal(runs[:17], 32, 16, rounds=True)) == [9, 8]
    assert sizes(deal(runs, 32, 64, rounds=True)) == [50] * 4


def test_without_rounds_runs_are_spread_over_every_free_worker() -> None:
    runs = list(range(200))
    assert sizes(deal(runs, 32, 16, rounds=False)) == [7] * 8 + [6] * 24
    assert sizes(deal(runs[:3], 8, 16, rounds=False)) == [1, 1, 1]
    assert sizes(deal(runs[:10], 4, 16, rounds=False)) == [3, 3, 2, 2]


@pytest.mark.parametrize("rounds", [True, False])
def test_a_lone_run_goes_out_at_once_and_every_run_is_dealt_once(rounds: bool) -> None:
    assert deal([7], 32, 16, rounds=rounds) == [[7]]
    assert deal([], 32, 16, rounds=rounds) == []
    runs = list(range(500))
    batches = deal(runs, 32, 16, rounds=rounds)
    assert len(batches) <= 32 and all(batches)
    assert Counter(r for b in batches for r in b) == Counter(runs)


def test_more_runs_than_workers_can_hold_still_all_go_out() -> None:
    # The engine never starts more than free * run_batch runs; dealt anyway, none is left.
    batches = deal(list(range(100)), 2, 16, rounds=True)
    assert sizes(batches) == [50, 50]


@pytest.mark.parametrize(("workers", "run_batch"), [(0, 16), (4, 0), (-1, 16)])
def test_no_worker_or_no_run_per_worker_is_refused(workers: int, run_batch: int) -> None:
    with pytest.raises(InvalidConfig, match="at least one"):
        deal([1], workers, run_batch, rounds=True)


def engine(aggregates: int, per_aggregate: int, *, rounds: bool) -> DispatchEngine:
    made = engine_with(*(doc(f"a{index:03}", per_aggregate) for index in range(aggregates)))
    made.rounds = rounds
    return made


def round_sizes(made: DispatchEngine, batches: list[list[Any]]) -> list[int]:
    """Drive every batch to its end; the size of each publish round (or of each
    publish's batch, without rounds), in order."""
    found: list[int] = []

    def perform(op: Any) -> Any:
        if isinstance(op, PublishRound):
            found.append(len(op.entries))
            return [None] * len(op.entries)
        if isinstance(op, TrimRound):
            return [True] * len(op.plans)
        return None  # a publish confirmed before it returns

    for batch in batches:
        assert drive(made.run_batch(batch), perform) == [RunOutcome.DONE] * len(batch)
        for slot in batch:
            made.finish(slot, RunOutcome.DONE)
    return found


def test_the_engine_packs_a_backlog_into_rounds_of_run_batch_entries() -> None:
    made = engine(200, 10, rounds=True)
    batches = made.start_batches(32)
    assert sizes(batches) == [16] * 5 + [15] * 8
    rounds = round_sizes(made, batches)
    # 130 rounds of 15-16 entries, where runs spread over 32 workers made 320 of 6-7.
    assert len(rounds) == 130 and min(rounds) == 15
    assert made.queue.backlog() == 0


def test_the_engine_spreads_runs_without_rounds() -> None:
    made = engine(200, 10, rounds=False)
    assert sizes(made.start_batches(32)) == [7] * 8 + [6] * 24


def test_the_engine_starts_at_most_run_batch_runs_per_free_worker() -> None:
    made = engine(100, 1, rounds=True)
    assert sizes(made.start_batches(2)) == [16, 16]
    assert made.start_batches(0) == []
    assert made.queue.ready() == 100 - 32
