"""What the stream brings: ``postBatchResumeToken`` keeps a quiet collection's position
moving (a unit test on the token handling, since the wire server sends no such token), and
an event's copy of the document is published without reloading it."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.checkpoint import Sweep
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig, PollChanges
from docoutbox.dispatch.engine.scheduler import RunOutcome
from docoutbox.errors import ChangeStreamLost, InvalidConfig
from docoutbox.ports.dispatch import ChangeEvent
from docoutbox.store.core import FindPending
from docoutbox.store.document import REVISION
from docoutbox_mongo.changes import MongoChangeSource


def engine_of(
    config: DispatcherConfig,
    ownership: Any = None,
    *,
    stream: bool = True,
    checkpoints: bool = True,
    monotonic: Callable[[], float] = lambda: 0.0,
) -> DispatchEngine:
    return DispatchEngine(
        config,
        ownership or SoleOwner(),
        stream=stream,
        checkpoints=checkpoints,
        monotonic=monotonic,
        clock=lambda: datetime(2030, 1, 1, tzinfo=UTC),
        rng=random.Random(0),
    )


class FakeStream:
    """A change stream whose batches end with the server's post-batch token."""

    def __init__(self, batches: list[tuple[list[dict[str, Any]], dict[str, Any] | None]]) -> None:
        self.batches = batches
        self.resume_token: dict[str, Any] | None = None

    def try_next(self) -> dict[str, Any] | None:
        changes, post_batch = self.batches[0]
        if changes:
            change = changes.pop(0)
            self.resume_token = change["_id"]
            return change
        self.batches.pop(0)
        if post_batch is not None:
            self.resume_token = post_batch
        return None

    def close(self) -> None:
        return None


class FakeCollection:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.watched: list[dict[str, Any]] = []

    def watch(self, pipeline: Any, **kwargs: Any) -> FakeStream:
        self.watched.append(kwargs)
        return self.stream


def change(n: int) -> dict[str, Any]:
    return {"_id": {"_data": f"{n:04d}"}, "operationType": "update", "fullDocument": {"_id": n}}


def test_a_batch_end_token_past_the_last_change_becomes_a_position_event() -> None:
    stream = FakeStream(
        [
            ([change(1), change(2)], {"_data": "0009"}),  # filtered-out changes up to 9
            ([], {"_data": "0015"}),  # a quiet period: the server still moves on
            ([], {"_data": "0015"}),  # no further move: nothing to report
            ([change(16)], None),  # a server that sends no post-batch token
        ]
    )
    source = MongoChangeSource(FakeCollection(stream))
    source.open({"resume_after": {"_data": "0000"}})
    first = source.poll(10)
    assert [e.position for e in first] == [
        {"resume_after": {"_data": "0001"}},
        {"resume_after": {"_data": "0002"}},
        {"resume_after": {"_data": "0009"}},
    ]
    assert first[-1].document is None
    assert source.poll(10) == [ChangeEvent({"resume_after": {"_data": "0015"}}, None)]
    assert source.poll(10) == []
    [last] = source.poll(10)
    assert last.position == {"resume_after": {"_data": "0016"}} and last.document == {"_id": 16}


def test_a_full_batch_does_not_report_the_token_early() -> None:
    stream = FakeStream([([change(1), change(2)], {"_data": "0009"})])
    source = MongoChangeSource(FakeCollection(stream))
    source.open({"resume_after": {"_data": "0000"}})
    assert [e.document for e in source.poll(2)] == [{"_id": 1}, {"_id": 2}]  # batch not over


def test_the_checkpoint_follows_position_only_events() -> None:
    engine = engine_of(DispatcherConfig(name="q", checkpoint_interval=0))
    engine.begin()
    saved: list[Any] = []
    quiet = ChangeEvent({"resume_after": {"_data": "0015"}}, None)
    replies: dict[str, Any] = {"LoadCheckpoint": {"resume_after": {"_data": "0001"}}}
    for _ in range(2):  # open the stream, then poll
        flow = engine.turn()
        op = next(flow)
        try:
            while True:
                name = type(op).__name__
                if name == "SaveCheckpoint":
                    saved.append(op.position)
                reply = [quiet] if isinstance(op, PollChanges) else replies.get(name)
                op = flow.send(reply)
        except StopIteration:
            pass
    assert saved == [{"resume_after": {"_data": "0015"}}]


def test_a_run_publishes_from_the_requests_copy_without_reloading_or_repeating() -> None:
    """The copy an event carries is published as is; a later, staler copy does not bring
    back the entries this instance trimmed since."""
    engine = engine_of(DispatcherConfig(name="q", trim_delay=0))
    entry = {
        "id": "e1",
        "type": "Added",
        "payload": {},
        "created_at": datetime(2030, 1, 1, tzinfo=UTC),
        "seq": 1,
        "aggregate_id": "a",
        "aggregate_type": "Counter",
    }
    doc = {"_id": "a", "partition": 0, "version": 1, "outbox": [entry]}

    def run_once() -> list[str]:
        [slot] = engine.start_runs()
        flow, ops, reply = engine.run(slot), list[str](), None
        try:
            while True:
                op = flow.send(reply)
                ops.append(type(op).__name__)
                reply = True if ops[-1] == "Write" else None
        except StopIteration:
            pass
        engine.finish(slot, RunOutcome.DONE)
        return ops

    engine.request(doc)
    assert run_once() == ["Publish", "Write"]  # no Load: the event's copy is used
    engine.request(dict(doc))  # a stale copy, from before the trim
    assert run_once() == []  # nothing published again, nothing read
    # A copy with entries trimmed since loses its store tag: it is no longer that copy.
    stale = {**doc, "outbox": [entry, {**entry, "id": "e2", "seq": 2}], REVISION: "t1"}
    kept = engine._unpublished(stale)
    assert kept is not None and REVISION not in kept and len(kept["outbox"]) == 1
    assert engine._unpublished({**doc, "outbox": [{**entry, "id": "e3"}], REVISION: "t1"}) == {
        **doc,
        "outbox": [{**entry, "id": "e3"}],
        REVISION: "t1",
    }


def test_a_poll_hands_over_what_arrived_instead_of_waiting_for_another_round_trip() -> None:
    class Cursor:
        def __init__(self) -> None:
            self._data = [change(1), change(2)]

    class Buffered(FakeStream):
        """A stream whose received batch is visible, like pymongo's."""

        def __init__(self) -> None:
            super().__init__([])
            self._cursor = Cursor()
            self.round_trips = 0

        def try_next(self) -> dict[str, Any] | None:
            if not self._cursor._data:
                self.round_trips += 1  # a getMore
                self._cursor._data = [change(3)]
            item = self._cursor._data.pop(0)
            self.resume_token = item["_id"]
            return item

    stream = Buffered()
    source = MongoChangeSource(FakeCollection(stream))
    source.open({"resume_after": {"_data": "0000"}})
    assert [e.document for e in source.poll(500)] == [{"_id": 1}, {"_id": 2}]
    assert stream.round_trips == 0
    assert [e.document for e in source.poll(500)] == [{"_id": 3}]  # the next poll fetches


def test_the_first_poll_after_an_opening_that_brought_nothing_sends_no_get_more() -> None:
    class Cursor:
        def __init__(self) -> None:
            self._data: list[dict[str, Any]] = []  # the opening's reply: nothing yet

    class Empty(FakeStream):
        def __init__(self) -> None:
            super().__init__([])
            self._cursor = Cursor()
            self.round_trips = 0

        def try_next(self) -> dict[str, Any] | None:
            self.round_trips += 1  # a getMore
            return None

    stream = Empty()
    source = MongoChangeSource(FakeCollection(stream))
    source.open({"resume_after": {"_data": "0000"}})
    assert source.poll(500) == []
    assert stream.round_trips == 0
    assert source.poll(500) == []
    assert stream.round_trips == 1
    source.open({"resume_after": {"_data": "0000"}})  # again after each opening
    assert source.poll(500) == []
    assert stream.round_trips == 1


def test_an_invalidate_event_is_a_lost_stream() -> None:
    stream = FakeStream([([{"_id": {"_data": "0001"}, "operationType": "invalidate"}], None)])
    source = MongoChangeSource(FakeCollection(stream))
    source.open({"resume_after": {"_data": "0000"}})
    with pytest.raises(ChangeStreamLost, match="invalidated"):
        source.poll(10)
    with pytest.raises(ChangeStreamLost):  # closed
        source.poll(10)


def test_only_an_updates_looked_up_document_counts_as_current() -> None:
    inserted = {**change(1), "operationType": "insert"}
    replaced = {**change(2), "operationType": "replace"}
    stream = FakeStream([([inserted, replaced, change(3)], None)])
    source = MongoChangeSource(FakeCollection(stream))
    source.open({"resume_after": {"_data": "0000"}})
    assert [e.current for e in source.poll(10)] == [False, False, True]


def test_a_document_as_of_its_change_is_reloaded_before_publishing() -> None:
    engine = engine_of(DispatcherConfig(name="q"))
    engine.request({"_id": "a", "partition": 0, "outbox": [{"id": "e1"}]}, reuse=False)
    [slot] = engine.start_runs()
    assert type(next(engine.run(slot))).__name__ == "Load"


def test_the_stream_is_not_polled_while_the_aggregates_in_hand_reach_max_backlog() -> None:
    """Events bring whole documents: polling on would hold the whole backlog in memory.
    At most one batch (here max_backlog, the smaller) is in hand."""
    engine = engine_of(DispatcherConfig(name="q", max_backlog=3, batch_size=4), checkpoints=False)
    engine.begin()
    counter = iter(range(1000))
    polls: list[int] = []

    def turn() -> None:
        flow = engine.turn()
        reply: Any = None
        try:
            while True:
                op = flow.send(reply)
                reply = None
                if isinstance(op, PollChanges):
                    polls.append(op.max_events)
                    reply = [
                        ChangeEvent(
                            {"n": n}, {"_id": f"a{n}", "outbox": [{"id": f"e{n}"}]}, current=True
                        )
                        for n in (next(counter) for _ in range(op.max_events))
                    ]
                elif type(op).__name__ == "StartMarker":
                    reply = {"n": -1}
                elif type(op).__name__ == "FindPending":
                    reply = []  # the start-up sweep finds nothing
        except StopIteration:
            pass

    for _ in range(5):
        turn()
    assert polls == [3] and engine.queue.backlog() == 3  # then it holds off
    [slot, *_] = engine.start_runs()
    engine.finish(slot, RunOutcome.DONE)
    turn()
    assert polls == [3, 1]


class Regained:
    """Owns every partition; reports partition 0 acquired (again) once asked to."""

    def __init__(self) -> None:
        self.acquired: list[frozenset[int] | None] = []

    def start(self) -> None: ...

    def stop(self, *, release: bool = True) -> None: ...

    def owned(self) -> frozenset[int] | None:
        return None

    def enter(self, partition: int) -> bool:
        return True

    def leave(self, partition: int) -> None: ...

    def valid(self, partition: int) -> bool:
        return True

    def take_acquired(self) -> list[frozenset[int] | None]:
        taken, self.acquired = self.acquired, []
        return taken


def test_copies_queued_before_a_partition_is_regained_are_not_published_from() -> None:
    """Another owner may have published and trimmed the entries meanwhile: reload."""
    ownership = Regained()
    engine = engine_of(
        DispatcherConfig(name="q", partitions=2, sweep_interval=3600),
        ownership,
        stream=False,
        checkpoints=False,
    )
    engine.begin()
    engine.sweeps.clear()
    engine.request({"_id": "a", "partition": 0, "outbox": [{"id": "e1"}]})
    engine.request({"_id": "b", "partition": 1, "outbox": [{"id": "e2"}]})
    ownership.acquired = [frozenset({0})]
    flow = engine.turn()
    reply: Any = None
    try:
        while True:
            op = flow.send(reply)
            reply = [] if type(op).__name__ == "FindPending" else None
    except StopIteration:
        pass
    slots = {slot.aggregate_id: slot.document for slot in engine.start_runs()}
    assert slots["a"] is None  # reloaded
    assert slots["b"] == {"_id": "b", "partition": 1, "outbox": [{"id": "e2"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stream_engine(clock: Clock, **options: Any) -> DispatchEngine:
    engine = engine_of(
        DispatcherConfig(name="q", poll_interval=0.05, checkpoint_interval=0, **options),
        monotonic=clock,
    )
    engine.begin()
    return engine


def turn_ops(engine: DispatchEngine, polled: list[ChangeEvent] | None = None) -> list[str]:
    """One turn; a poll brings ``polled`` (nothing if None). The operations' names."""
    replies: dict[str, Any] = {"LoadCheckpoint": {"resume_after": {"_data": "0001"}}}
    names: list[str] = []
    flow = engine.turn()
    try:
        op = next(flow)
        while True:
            names.append(type(op).__name__)
            reply = (polled or []) if isinstance(op, PollChanges) else replies.get(names[-1])
            op = flow.send(reply)
    except StopIteration:
        pass
    return names


def pending(n: int) -> ChangeEvent:
    doc = {"_id": f"a{n}", "partition": 0, "outbox": [{"id": f"e{n}"}]}
    return ChangeEvent({"resume_after": {"_data": f"{n:04d}"}}, doc, True)


def test_a_drained_stream_is_read_again_after_the_poll_interval_not_on_every_turn() -> None:
    """Runs finishing wake the control loop many times a second; an empty read is not
    repeated on each wake (on the wire server every read scans the oplog)."""
    clock = Clock()
    engine = stream_engine(clock)
    assert "OpenStream" in turn_ops(engine)
    assert "PollChanges" in turn_ops(engine)  # empty
    assert "PollChanges" not in turn_ops(engine)  # a wake right after: no read
    due = engine.next_due()
    assert due is not None and abs(due - 0.05) < 1e-9  # drivers sleep until then
    clock.now = 0.049
    assert "PollChanges" not in turn_ops(engine)
    clock.now = 0.05
    assert "PollChanges" in turn_ops(engine, [pending(1)])
    assert "PollChanges" in turn_ops(engine)  # a read that brought changes: read on


def waiting_engine(clock: Clock, *, active: bool = True, **options: Any) -> DispatchEngine:
    """An engine reading every 1/16 s, its stream open (times stay exact in binary); with
    ``active``, its first read brought a pending document (so its waits start short)."""
    engine = engine_of(
        DispatcherConfig(name="w", poll_interval=1 / 16, checkpoint_interval=0, **options),
        monotonic=clock,
    )
    engine.begin()
    turn_ops(engine)  # opens the stream
    if active:
        assert "PollChanges" in turn_ops(engine, [pending(0)])
    return engine


def reads_at(engine: DispatchEngine, clock: Clock, until: float) -> list[float]:
    """Turn every 1/64 s up to ``until`` (every read brings nothing): when it read, in
    sixteenths of a second."""
    read = []
    for tick in range(round(clock.now * 64), round(until * 64) + 1):
        clock.now = tick / 64
        if "PollChanges" in turn_ops(engine):
            read.append(clock.now * 16)
    return read


def test_reads_that_bring_nothing_space_out_up_to_max_stream_wait() -> None:
    """An idle stream is read ever less often (on the wire server every read scans the
    whole oplog): the wait doubles from poll_interval up to max_stream_wait."""
    clock = Clock()
    engine = waiting_engine(clock, max_stream_wait=0.5)
    assert reads_at(engine, clock, 3) == [0, 1, 3, 7, 15, 23, 31, 39, 47]
    due = engine.next_due()
    assert due is not None and due == 0.5 - 1 / 16  # drivers sleep until then


def test_a_stream_just_opened_waits_the_longest_until_a_read_brings_a_document() -> None:
    """Nothing says entries are coming when the stream opens: its reads are
    max_stream_wait apart at once (on the wire server every read scans the whole oplog),
    not poll_interval, until one brings a pending document."""
    clock = Clock()
    engine = waiting_engine(clock, active=False, max_stream_wait=1.0)
    assert reads_at(engine, clock, 2) == [0, 16, 32]
    clock.now = 3.0
    assert "PollChanges" in turn_ops(engine, [pending(1)])  # a document: read on
    assert "PollChanges" in turn_ops(engine)  # nothing: wait poll_interval now
    assert reads_at(engine, clock, 4) == [49, 51, 55, 63]


def test_a_stream_reopened_starts_with_the_longest_wait_again() -> None:
    clock = Clock()
    engine = waiting_engine(clock, max_stream_wait=1.0)
    assert reads_at(engine, clock, 3 / 16) == [0, 1, 3]
    engine._open = False  # as after a read that failed
    clock.now = 7 / 16  # the next read was due
    assert "OpenStream" in turn_ops(engine)
    assert reads_at(engine, clock, 2) == [7, 23]


def test_a_read_that_brings_a_pending_document_starts_the_waits_over() -> None:
    clock = Clock()
    engine = waiting_engine(clock, max_stream_wait=1.0)
    assert reads_at(engine, clock, 7 / 16) == [0, 1, 3, 7]  # the next at 15/16
    clock.now = 15 / 16
    assert "PollChanges" in turn_ops(engine, [pending(1)])  # a document: read on
    assert "PollChanges" in turn_ops(engine)  # nothing: wait poll_interval again
    assert reads_at(engine, clock, 18 / 16) == [16, 18]


def test_a_position_only_read_counts_as_bringing_nothing() -> None:
    """Writes that leave no pending entry move the stream's position, not its waits."""
    clock = Clock()
    engine = waiting_engine(clock, max_stream_wait=1.0)
    moved = ChangeEvent({"resume_after": {"_data": "0009"}}, None)
    assert "PollChanges" in turn_ops(engine, [moved])
    clock.now = 1 / 16
    assert "PollChanges" in turn_ops(engine, [moved])
    clock.now = 3 / 16 - 1 / 64
    assert "PollChanges" not in turn_ops(engine)  # the wait doubled
    clock.now = 3 / 16
    assert "PollChanges" in turn_ops(engine)


def test_read_soon_reads_at_the_next_turn_and_starts_the_waits_over() -> None:
    clock = Clock()
    engine = waiting_engine(clock, max_stream_wait=1.0)
    assert reads_at(engine, clock, 7 / 16) == [0, 1, 3, 7]
    clock.now = 8 / 16
    assert "PollChanges" not in turn_ops(engine)  # waits until 15/16
    engine.read_soon()
    assert engine.next_due() is None
    assert "PollChanges" in turn_ops(engine)
    assert reads_at(engine, clock, 12 / 16) == [9, 11]


def test_without_max_stream_wait_an_idle_stream_is_read_every_poll_interval() -> None:
    clock = Clock()
    engine = waiting_engine(clock)
    assert reads_at(engine, clock, 1) == list(range(17))


@pytest.mark.parametrize("wait", [0.01, -1.0, "1"])
def test_max_stream_wait_below_poll_interval_or_not_seconds_is_refused(wait: Any) -> None:
    with pytest.raises(InvalidConfig, match="max_stream_wait"):
        DispatcherConfig(poll_interval=0.05, max_stream_wait=wait)


def test_the_stream_is_not_read_while_the_backlog_is_full() -> None:
    clock = Clock()
    engine = stream_engine(clock, max_backlog=2)
    turn_ops(engine)
    assert "PollChanges" in turn_ops(engine, [pending(1), pending(2)])
    clock.now = 1.0
    assert "PollChanges" not in turn_ops(engine)  # two aggregates in hand: runs first
    for slot in engine.start_runs():
        engine.finish(slot, RunOutcome.DONE)
    assert "PollChanges" in turn_ops(engine)


def test_the_stream_is_not_read_while_a_round_of_runs_waits_for_workers() -> None:
    clock = Clock()
    engine = stream_engine(clock, concurrency=2, run_batch=1)
    turn_ops(engine)
    assert "PollChanges" in turn_ops(engine, [pending(1), pending(2), pending(3)])
    clock.now = 1.0
    assert "PollChanges" not in turn_ops(engine)  # three runs wait for two workers
    started = engine.start_runs()
    assert len(started) == 2
    assert "PollChanges" in turn_ops(engine)  # one waits: read on while the two run


def test_a_sweep_reads_no_page_while_a_round_of_runs_waits_for_workers() -> None:
    """A sweep keeps one round of runs ready, not ``max_backlog``: a change that arrives
    during the sweep of a large backlog waits behind one round, not behind the backlog."""
    engine = engine_of(
        DispatcherConfig(name="s", concurrency=2, run_batch=1, sweep_page=3),
        stream=False,
        checkpoints=False,
    )
    engine.begin()
    engine.sweeps.append(Sweep(None, None))
    pages = iter(range(100))

    def sweep_turn() -> bool:
        """One turn; True if it fetched a page (of three pending documents)."""
        flow, fetched = engine.turn(), False
        try:
            op = next(flow)
            while True:
                assert isinstance(op, FindPending)
                fetched, first = True, next(pages) * 3
                op = flow.send([pending(n).document for n in range(first, first + 3)])
        except StopIteration:
            return fetched

    assert sweep_turn()
    assert not sweep_turn()  # three runs ready for two workers
    assert len(engine.start_runs()) == 2
    assert sweep_turn()  # one ready: the next page
    assert engine.queue.backlog() == 6 < engine.config.max_backlog


def test_runs_in_flight_are_workers_times_run_batch_so_trim_rounds_carry_many_pulls() -> None:
    engine = stream_engine(Clock(), run_batch=16)
    for n in range(600):
        engine.request(pending(n).document)
    assert len(engine.start_runs()) == 32 * 16


def test_the_server_sends_at_most_batch_size_changes_per_round_trip() -> None:
    coll = FakeCollection(FakeStream([]))
    MongoChangeSource(coll).open({"resume_after": {"_data": "0001"}})
    MongoChangeSource(coll, batch_size=7).open({"resume_after": {"_data": "0001"}})
    assert [w["batch_size"] for w in coll.watched] == [None, 7]
    with pytest.raises(ValueError, match="batch_size"):
        MongoChangeSource(coll, batch_size=0)
