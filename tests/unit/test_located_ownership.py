"""An ownership that locates documents itself (Cosmos DB feed ranges) and a stream that
loses the position of some partitions only: the engine requests, sweeps and recovers by
the ownership's partitions, not by the partition numbers stored on the documents."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from docoutbox.dispatch.engine.loop import (
    DispatchEngine,
    DispatcherConfig,
    LoadCheckpoint,
    OpenStream,
    PollChanges,
    StartMarker,
)
from docoutbox.errors import ChangeStreamLost, TransientStoreError
from docoutbox.ports.dispatch import ChangeEvent, Scope
from docoutbox.store.core import FindPending
from docoutbox.store.document import Document

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Ranges:
    """Holds ``mine``; a document's partition is its ``range`` field, not ``partition``."""

    def __init__(self, mine: set[int]) -> None:
        self.mine = mine
        self.located: list[Any] = []

    def locate(self, document: Document) -> int:
        self.located.append(document["_id"])
        located: int = document["range"]
        return located

    def start(self) -> None:
        return None

    def stop(self, *, release: bool = True) -> None:
        return None

    def owned(self) -> Scope:
        return frozenset(self.mine)

    def enter(self, partition: int) -> bool:
        return partition in self.mine

    def leave(self, partition: int) -> None:
        return None

    def valid(self, partition: int) -> bool:
        return partition in self.mine

    def take_acquired(self) -> list[Scope]:
        return []


def entry(aggregate: str) -> dict[str, Any]:
    return {
        "id": f"{aggregate}-1",
        "type": "Added",
        "payload": {},
        "created_at": NOW,
        "seq": 1,
        "aggregate_id": aggregate,
        "aggregate_type": "Counter",
    }


def doc(aggregate: str, located: int, stored: int) -> Document:
    return {"_id": aggregate, "partition": stored, "range": located, "outbox": [entry(aggregate)]}


def engine(ownership: Any, *, stream: bool = True) -> DispatchEngine:
    e = DispatchEngine(
        DispatcherConfig(name="q", partitions=16, sweep_interval=3600),
        ownership,
        stream=stream,
        checkpoints=True,
        monotonic=lambda: 0.0,
        clock=lambda: NOW,
        rng=random.Random(0),
    )
    e.begin()
    return e


def turn(e: DispatchEngine, reply: Callable[[Any], Any]) -> list[Any]:
    """One turn, answering each operation with ``reply(op)`` (raised if an exception)."""
    flow, ops, answer, error = e.turn(), list[Any](), None, None
    try:
        while True:
            op = flow.send(answer) if error is None else flow.throw(error)
            ops.append(op)
            answer, error = None, None
            result = reply(op)
            if isinstance(result, BaseException):
                error = result
            else:
                answer = result
    except StopIteration:
        pass
    return ops


def queued(e: DispatchEngine) -> dict[Any, int]:
    return {slot.aggregate_id: slot.partition for slot in e.start_runs()}


def test_events_go_to_the_partition_the_ownership_locates() -> None:
    ranges = Ranges({1})
    e = engine(ranges)
    events = [
        ChangeEvent({"p": 1}, doc("in", located=1, stored=7)),
        ChangeEvent({"p": 2}, doc("out", located=2, stored=1)),
    ]
    replies = {LoadCheckpoint: {"p": 0}, PollChanges: events}
    turn(e, lambda op: replies.get(type(op)))  # opens the stream
    turn(e, lambda op: replies.get(type(op)))  # polls
    assert queued(e) == {"in": 1}  # by the located range, whatever the stored partition
    assert ranges.located == ["in", "out"]


def test_a_sweep_pages_through_everything_and_keeps_its_scope() -> None:
    ranges = Ranges({1, 3})
    e = engine(ranges, stream=False)
    e.sweeps[0].scope = frozenset({1})
    page = [doc("a", 1, 5), doc("b", 3, 1), doc("c", 2, 1)]
    ops = turn(e, lambda op: page if isinstance(op, FindPending) else None)
    [find] = [op for op in ops if isinstance(op, FindPending)]
    assert find.partitions is None  # the stored partition numbers mean nothing here
    assert queued(e) == {"a": 1}  # b is ours but outside the sweep's scope, c is not ours


def test_the_stored_partition_check_is_skipped() -> None:
    flow = engine(Ranges({0})).check_partitions()
    assert next(flow, None) is None  # no sample of documents asked for


def test_a_partly_lost_stream_sweeps_those_partitions_and_stays_open() -> None:
    e = engine(Ranges({0, 1, 2}))
    lost = ChangeStreamLost("range gone", partitions={2})

    def reply(op: Any) -> Any:
        if isinstance(op, LoadCheckpoint):
            return {"p": 0}
        return lost if isinstance(op, PollChanges) else None

    turn(e, reply)  # opens the stream
    turn(e, reply)  # polls: range 2 lost
    assert [s.scope for s in e.sweeps] == [frozenset({2})]
    assert all(s.gate is None and s.older_than is None for s in e.sweeps)
    ops = turn(e, lambda op: [] if isinstance(op, FindPending | PollChanges) else None)
    assert not any(isinstance(op, StartMarker | OpenStream) for op in ops)  # still open
    assert any(isinstance(op, PollChanges) for op in ops)


def test_a_wholly_lost_stream_still_restarts() -> None:
    e = engine(Ranges({0}))

    def reply(op: Any) -> Any:
        if isinstance(op, LoadCheckpoint):
            return {"p": 0}
        return ChangeStreamLost("gone") if isinstance(op, PollChanges) else None

    turn(e, reply)
    turn(e, reply)

    def restart(op: Any) -> Any:
        if isinstance(op, FindPending):
            return TransientStoreError("down")  # the sweep stays queued
        return {"p": 9} if isinstance(op, StartMarker) else []

    ops = turn(e, restart)
    assert any(isinstance(op, StartMarker) for op in ops)
    assert [s.gate is not None for s in e.sweeps] == [True]
