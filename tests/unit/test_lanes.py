"""A stream made of independent lanes (Cosmos DB feed ranges): an unfinished event holds
back the checkpoint of its own lane only, never past an unfinished event (I5).

Positions here are ``{lane: token}``, a lane's token counting the events read from it, and
``merge`` takes each held lane's token from its own position, as the Cosmos change source
does with continuations (its ``merge_positions`` is tested in ``test_cosmos_changes.py``).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.checkpoint import Gate, LanedTracker, PositionTracker
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig, PollChanges
from docoutbox.dispatch.engine.scheduler import RunOutcome
from docoutbox.ports.dispatch import ChangeEvent
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.dispatch import MemoryChangeSource


def merge(latest: Any, held: Mapping[Hashable, Any]) -> Any:
    return {**latest, **{lane: position[lane] for lane, position in held.items()}}


class Lanes:
    """Events read from lanes, each done when the test says so."""

    def __init__(self, tracker: PositionTracker, lanes: str) -> None:
        self.tracker = tracker
        self.tokens = dict.fromkeys(lanes, 0)
        self.done: list[bool] = []
        self.lanes: list[str] = []

    def read(self, lane: str, *, done: bool = False) -> int:
        self.tokens[lane] += 1
        index = len(self.done)
        self.done.append(done)
        self.lanes.append(lane)
        self.tracker.add_event(dict(self.tokens), lambda: self.done[index], lane)
        return index

    def safe(self) -> dict[str, int]:
        self.tracker.advance()
        assert isinstance(self.tracker.safe, dict)
        return self.tracker.safe


def test_an_unfinished_event_holds_back_its_own_lane_only() -> None:
    lanes = Lanes(LanedTracker(merge, {"a": 0, "b": 0}), "ab")
    slow = lanes.read("a")
    lanes.read("b", done=True)
    lanes.read("b", done=True)
    lanes.read("a", done=True)
    assert lanes.safe() == {"a": 0, "b": 2}
    lanes.done[slow] = True
    assert lanes.safe() == {"a": 2, "b": 2}


def test_one_tracker_for_all_lanes_holds_every_lane_back() -> None:
    """What the laned tracker changes (a MongoDB stream keeps this one)."""
    lanes = Lanes(PositionTracker({"a": 0, "b": 0}), "ab")
    lanes.read("a")
    lanes.read("b", done=True)
    assert lanes.safe() == {"a": 0, "b": 0}


def test_a_lane_is_held_after_its_last_completed_event() -> None:
    lanes = Lanes(LanedTracker(merge, {"a": 0, "b": 0}), "ab")
    lanes.read("a", done=True)
    lanes.read("a")
    lanes.read("a", done=True)
    lanes.read("b", done=True)
    assert lanes.safe() == {"a": 1, "b": 1}


def test_an_event_without_a_lane_puts_every_lane_back_in_one_order() -> None:
    tracker = LanedTracker(merge, {"a": 0, "b": 0})
    lanes = Lanes(tracker, "ab")
    slow = lanes.read("a")
    lanes.read("b", done=True)
    tracker.add_event({"a": 1, "b": 1, "x": 1}, lambda: True, None)
    assert lanes.safe() == {"a": 0, "b": 0}
    lanes.done[slow] = True
    assert lanes.safe() == {"a": 1, "b": 1, "x": 1}
    lanes.read("b")
    lanes.read("a", done=True)
    assert lanes.safe() == {"a": 2, "b": 1}  # lanes again


def test_a_reset_gate_holds_back_every_lane() -> None:
    tracker = LanedTracker(merge, {"a": 0, "b": 0})
    lanes = Lanes(tracker, "ab")
    gate = Gate()
    tracker.reset({"a": 5, "b": 5}, gate)
    lanes.tokens = {"a": 5, "b": 5}
    lanes.read("b", done=True)
    assert lanes.safe() == {"a": 0, "b": 0} and tracker.latest == {"a": 5, "b": 6}
    gate.finished = True
    assert lanes.safe() == {"a": 5, "b": 6}


@pytest.mark.parametrize("seed", range(20))
def test_no_lane_passes_an_unfinished_event_and_a_caught_up_lane_is_saved_whole(
    seed: int,
) -> None:
    rng = random.Random(seed)
    lanes = Lanes(LanedTracker(merge, {"a": 0, "b": 0, "c": 0}), "abc")
    for _ in range(300):
        if rng.random() < 0.6:
            lanes.read(rng.choice("abc"), done=rng.random() < 0.5)
        else:
            waiting = [i for i, done in enumerate(lanes.done) if not done]
            if waiting:
                lanes.done[rng.choice(waiting)] = True
        safe = lanes.safe()
        for lane in "abc":
            mine = [lanes.done[i] for i, e in enumerate(lanes.lanes) if e == lane]
            completed = mine.index(False) if False in mine else len(mine)
            assert safe[lane] <= completed  # I5, lane by lane
            if completed == len(mine):
                assert safe[lane] == lanes.tokens[lane]


def test_the_engine_checkpoints_a_lane_while_another_lanes_run_is_unfinished() -> None:
    engine = DispatchEngine(
        DispatcherConfig(name="l", checkpoint_interval=0),
        SoleOwner(),
        stream=True,
        checkpoints=True,
        monotonic=lambda: 0.0,
        clock=lambda: datetime(2030, 1, 1, tzinfo=UTC),
        rng=random.Random(0),
        merge_positions=merge,
    )
    engine.begin()

    def doc(name: str) -> dict[str, Any]:
        return {"_id": name, "partition": 0, "outbox": [{"id": f"{name}-1"}]}

    events = [
        ChangeEvent({"a": 1, "b": 0}, doc("x"), True, lane="a"),
        ChangeEvent({"a": 1, "b": 1}, doc("y"), True, lane="b"),
    ]
    saved: list[Any] = []

    def turn(polled: list[ChangeEvent]) -> None:
        flow, reply = engine.turn(), None
        try:
            while True:
                op = flow.send(reply)
                reply = {"a": 0, "b": 0} if type(op).__name__ == "LoadCheckpoint" else None
                if isinstance(op, PollChanges):
                    reply, polled = polled, []
                elif type(op).__name__ == "SaveCheckpoint":
                    saved.append(op.position)
        except StopIteration:
            pass

    turn([])  # opens the stream
    turn(events)
    slots = {slot.aggregate_id: slot for slot in engine.start_runs()}
    engine.finish(slots["y"], RunOutcome.DONE)
    turn([])
    assert saved[-1] == {"a": 0, "b": 1}
    engine.finish(slots["x"], RunOutcome.DONE)
    turn([])
    assert saved[-1] == {"a": 1, "b": 1}


def test_a_source_in_a_thread_keeps_its_lanes_and_an_async_merge_gives_one_lane() -> None:
    """``merge_positions`` does no I/O: ``in_thread`` hands it over as it is. The engine
    calls it in its own loop, so a coroutine function cannot serve."""

    class LanedSource(MemoryChangeSource):
        merge_positions = staticmethod(merge)

    class AsyncMerge(MemoryChangeSource):
        async def merge_positions(self, latest: Any, held: Any) -> Any:
            return merge(latest, held)

    def tracker_of(source: Any) -> PositionTracker:
        dispatcher = AsyncDispatcher(
            in_thread(backend),
            in_thread(MemoryPublisher()),
            in_thread(MemoryDeadLetters()),
            source=source,
        )
        return dispatcher.engine.tracker

    backend = MemoryBackend()
    assert isinstance(tracker_of(in_thread(LanedSource(backend))), LanedTracker)
    assert type(tracker_of(AsyncMerge(backend))) is PositionTracker
