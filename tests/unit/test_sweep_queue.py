"""Sweeps queued by the engine: one covering another is not queued twice.

At start a leased instance sweeps what it owns and is told it acquired the same share;
both used to be queued, so the documents were swept twice, the second time after the first
had been logged as done.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from docoutbox.dispatch.engine.loop import (
    DispatchEngine,
    DispatcherConfig,
    OpenStream,
    PollChanges,
    StartMarker,
)
from docoutbox.store.core import FindPending

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ALL = frozenset(range(4))


class Leased:
    """An ownership that holds ``owned`` and reports scopes acquired when told to."""

    def __init__(self, owned: frozenset[int]) -> None:
        self.held = owned
        self.gained: list[frozenset[int] | None] = [owned]

    def start(self) -> None:
        return None

    def stop(self, *, release: bool = True) -> None:
        return None

    def owned(self) -> frozenset[int]:
        return self.held

    def enter(self, partition: int) -> bool:
        return partition in self.held

    def leave(self, partition: int) -> None:
        return None

    def valid(self, partition: int) -> bool:
        return partition in self.held

    def take_acquired(self) -> list[frozenset[int] | None]:
        gained, self.gained = self.gained, []
        return gained


def engine(ownership: Leased, *, stream: bool, sweep_page: int = 100) -> DispatchEngine:
    config = DispatcherConfig(name="q", partitions=4, sweep_interval=3600, sweep_page=sweep_page)
    e = DispatchEngine(
        config,
        ownership,
        stream=stream,
        checkpoints=False,
        monotonic=lambda: 0.0,
        clock=lambda: NOW,
        rng=random.Random(0),
    )
    e.begin()
    return e


def turn(e: DispatchEngine, answer: Callable[[Any], Any]) -> list[Any]:
    """One turn; every op answered by ``answer``. Returns the ops."""
    ops, flow, reply = [], e.turn(), None
    try:
        while True:
            op = flow.send(reply)
            ops.append(op)
            reply = answer(op)
    except StopIteration:
        return ops


def stream_answers(page: list[dict[str, Any]]) -> Callable[[Any], Any]:
    def answer(op: Any) -> Any:
        if isinstance(op, FindPending):
            return page
        if isinstance(op, StartMarker):
            return {"_data": "start"}
        if isinstance(op, PollChanges):
            return []
        assert isinstance(op, OpenStream), op
        return None

    return answer


def queries(e: DispatchEngine, turns: int = 4, page: list[dict[str, Any]] | None = None) -> list:
    found = []
    for _ in range(turns):
        ops = turn(e, stream_answers(page or []))
        found += [op.partitions for op in ops if isinstance(op, FindPending)]
    return found


def test_without_a_stream_the_first_share_is_swept_once() -> None:
    assert queries(engine(Leased(ALL), stream=False)) == [[0, 1, 2, 3]]


def test_a_fresh_stream_sweeps_the_first_share_once_behind_its_gate() -> None:
    e = engine(Leased(ALL), stream=True)
    assert queries(e) == [[0, 1, 2, 3]]
    assert e.tracker.safe is not None  # the gate's sweep was the one run: it opened


def test_a_smaller_acquisition_is_left_to_a_queued_sweep_that_covers_it() -> None:
    ownership = Leased(ALL)
    e = engine(ownership, stream=False)
    ownership.gained = [frozenset({2}), frozenset({1, 3})]  # before the sweep's first page
    assert queries(e) == [[0, 1, 2, 3]]


def test_an_acquisition_after_a_sweep_fetched_a_page_is_swept_from_the_start() -> None:
    ownership = Leased(ALL)
    e = engine(ownership, stream=False, sweep_page=1)
    doc = {"_id": "a", "partition": 3, "outbox": []}
    assert queries(e, turns=1, page=[doc]) == [[0, 1, 2, 3]]  # one page; more to come
    ownership.gained = [frozenset({3})]  # the sweep has passed partition 3's "a"
    assert queries(e, turns=3) == [[0, 1, 2, 3], [3]]


def test_a_covering_sweep_does_not_drop_a_gated_one() -> None:
    ownership = Leased(ALL)
    e = engine(ownership, stream=True, sweep_page=1)
    doc = {"_id": "a", "partition": 0, "outbox": []}
    assert queries(e, turns=1, page=[doc]) == [[0, 1, 2, 3]]  # the gated sweep's first page
    [gated] = e.sweeps
    assert gated.gate is not None
    ownership.gained = [None]  # every document, a wider scope than the gated sweep's
    assert queries(e) == [[0, 1, 2, 3], None]
    assert gated.gate.finished and e.tracker.safe is not None


def test_a_sweep_with_a_grace_period_covers_no_acquisition() -> None:
    ownership = Leased(ALL)
    e = engine(ownership, stream=False)
    e.sweeps[0].older_than = NOW  # a periodic sweep: only documents older than NOW
    ownership.gained = [frozenset({1})]
    assert queries(e) == [[0, 1, 2, 3], [1]]
