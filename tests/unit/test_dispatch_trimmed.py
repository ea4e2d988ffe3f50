"""The dispatcher's memory of what it trimmed: a stale copy does not publish a trimmed
entry again, and the memory follows what is in flight, not the backlog."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig
from docoutbox.dispatch.engine.scheduler import RunOutcome
from docoutbox.dispatch.engine.trimmed import PER_AGGREGATE, TrimmedIds, aggregates_in_flight
from docoutbox.store.document import REVISION

NOW = datetime(2030, 1, 1, tzinfo=UTC)
#: A small in-flight bound, so the tests can go past it.
SMALL = {"max_backlog": 4, "batch_size": 2, "sweep_page": 2, "concurrency": 1}


def engine_for(**options: Any) -> DispatchEngine:
    return DispatchEngine(
        DispatcherConfig(name="t", trim_delay=0, **options),  # runs write their trims
        SoleOwner(),
        stream=True,
        checkpoints=True,
        monotonic=lambda: 0.0,
        clock=lambda: NOW,
        rng=random.Random(0),
    )


def entry(aggregate: str, seq: int) -> dict[str, Any]:
    return {
        "id": f"{aggregate}-e{seq}",
        "type": "Added",
        "payload": {},
        "created_at": NOW,
        "seq": seq,
        "aggregate_id": aggregate,
        "aggregate_type": "Counter",
    }


def copy(aggregate: str, seqs: range, last: int | None = None) -> dict[str, Any]:
    """The document as read when its outbox held ``seqs`` and ``last`` was its last seq."""
    return {
        "_id": aggregate,
        "partition": 0,
        "version": 1,
        "outbox": [entry(aggregate, s) for s in seqs],
        "outbox_seq": seqs[-1] if last is None and seqs else last or 0,
        REVISION: "tag",
    }


def run_requested(engine: DispatchEngine, doc: dict[str, Any]) -> list[str]:
    """Request a run with ``doc`` as the request's copy, run it (every write succeeds) and
    return the IDs it published."""
    assert engine.request(doc) is not None
    [slot] = engine.start_runs()
    flow, published, reply = engine.run(slot), list[str](), None
    try:
        while True:
            op = flow.send(reply)
            reply = None
            name = type(op).__name__
            if name == "Publish":
                published.append(op.entry.id)
            elif name == "Write":
                reply = True
            elif name == "Load":
                raise AssertionError("the run reloaded instead of using the copy")
    except StopIteration:
        pass
    engine.finish(slot, RunOutcome.DONE)
    return published


def test_a_stale_copy_arriving_right_after_its_trim_is_not_published_again() -> None:
    engine = engine_for()
    assert run_requested(engine, copy("a", range(1, 4))) == ["a-e1", "a-e2", "a-e3"]
    # An event read before that trim, handed over right after it.
    assert run_requested(engine, copy("a", range(1, 4))) == []
    # A copy read after a commit added e4 but before the trim: only e4 is new.
    assert run_requested(engine, copy("a", range(1, 5))) == ["a-e4"]


def test_a_stale_copy_is_skipped_after_as_many_other_trims_as_can_be_in_flight() -> None:
    engine = engine_for(**SMALL)
    bound = aggregates_in_flight(**SMALL)
    assert run_requested(engine, copy("a", range(1, 3))) == ["a-e1", "a-e2"]
    # Before the stale copy of "a" runs, every other aggregate that can be in hand or in
    # a read is published and trimmed.
    for n in range(bound - 1):
        assert run_requested(engine, copy(f"b{n}", range(1, 2))) == [f"b{n}-e1"]
    assert run_requested(engine, copy("a", range(1, 3))) == []


def test_the_memory_holds_at_most_the_aggregates_that_can_be_in_flight() -> None:
    """However long the backlog: a count bound, not a size or a time."""
    engine = engine_for(**SMALL)
    bound = aggregates_in_flight(**SMALL)
    for n in range(20 * bound):
        assert len(run_requested(engine, copy(f"agg{n}", range(1, 4)))) == 3
        assert engine.trimmed.remembered() <= bound
        assert len(engine.trimmed) <= 3 * bound
    assert engine.trimmed.remembered() == bound
    assert ("agg0", "agg0-e1") not in engine.trimmed
    last = 20 * bound - 1
    assert (f"agg{last}", f"agg{last}-e1") in engine.trimmed


def test_a_hot_aggregate_keeps_at_most_per_aggregate_ids() -> None:
    """Run after run of one aggregate: its IDs stop at the per-aggregate bound."""
    engine = engine_for()
    runs = PER_AGGREGATE // 3 + 50
    for run in range(runs):
        seqs = range(3 * run + 1, 3 * run + 4)
        assert len(run_requested(engine, copy("hot", seqs))) == 3
        assert len(engine.trimmed) <= PER_AGGREGATE
    assert len(engine.trimmed) == PER_AGGREGATE
    last = 3 * runs
    assert ("hot", f"hot-e{last}") in engine.trimmed and ("hot", "hot-e1") not in engine.trimmed


def test_a_copy_that_no_longer_shows_an_entry_does_not_forget_it() -> None:
    """An older copy may still come after a newer one (a change stream hands over a batch
    fetched before a sweep page that came meanwhile): it must not publish again."""
    engine = engine_for()
    assert run_requested(engine, copy("a", range(1, 3))) == ["a-e1", "a-e2"]
    assert run_requested(engine, copy("a", range(3, 4))) == ["a-e3"]  # read after the trim
    assert run_requested(engine, copy("a", range(1, 4))) == []  # read before it


def test_a_copy_without_trimmed_entries_is_returned_as_is() -> None:
    trimmed = TrimmedIds(aggregates=4, per_aggregate=100)
    trimmed.add(copy("a", range(1, 6)), ["a-e5"])
    older = copy("a", range(1, 5))
    assert trimmed.unpublished(older) is older
    kept = trimmed.unpublished(copy("a", range(1, 6)))
    assert kept is not None and [e["id"] for e in kept["outbox"]] == [
        "a-e1",
        "a-e2",
        "a-e3",
        "a-e4",
    ]
    assert REVISION not in kept  # no longer that copy: its tag goes
    assert ("a", "a-e5") in trimmed


def test_each_aggregate_keeps_at_most_per_aggregate_ids_the_oldest_go_first() -> None:
    trimmed = TrimmedIds(aggregates=2, per_aggregate=3)
    doc = copy("a", range(1, 6))
    trimmed.add(doc, ["a-e1", "a-e2"])
    trimmed.add(doc, ["a-e3", "a-e4", "a-e5"])
    assert len(trimmed) == 3
    assert ("a", "a-e2") not in trimmed and ("a", "a-e3") in trimmed
    trimmed.add(copy("b", range(1, 2)), ["b-e1"])
    trimmed.add(copy("c", range(1, 2)), ["c-e1"])
    assert trimmed.remembered() == 2 and ("a", "a-e3") not in trimmed


def test_ids_are_per_aggregate() -> None:
    trimmed = TrimmedIds(aggregates=4, per_aggregate=4)
    trimmed.add(copy("a", range(1, 2)), ["x"])
    assert ("a", "x") in trimmed and ("b", "x") not in trimmed
    other = {**copy("b", range(1, 2)), "outbox": [{**entry("b", 1), "id": "x"}]}
    assert trimmed.unpublished(other) is other


def test_the_default_bound_follows_the_configuration() -> None:
    engine = engine_for()
    config = engine.config
    assert engine.trimmed.aggregates == aggregates_in_flight(
        max_backlog=config.max_backlog,
        batch_size=config.batch_size,
        sweep_page=config.sweep_page,
        concurrency=config.concurrency,
    )
    assert engine.trimmed.per_aggregate == PER_AGGREGATE
    with pytest.raises(ValueError, match="at least 1"):
        TrimmedIds(aggregates=0, per_aggregate=1)
