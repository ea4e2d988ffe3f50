"""How long an idle control loop sleeps: until its next timed work, not a fixed tick.

The engine says when time alone next gives a turn work (``wake_in``); drivers sleep that
long (``IdleWait``), woken sooner by what else brings work: runs finishing, a nudge, a
stop, and the scopes an announcing ownership gains (``LeaseKeeper.on_acquired``). An
ownership that does not announce them is looked at every ``poll_interval``.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.operations import MIN_IDLE_WAIT, IdleWait
from docoutbox.dispatch.drivers.ownership import LeaseKeeper, SoleOwner
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig
from docoutbox.errors import TransientStoreError
from docoutbox.ports.dispatch import AnnouncingOwnership, ChangeEvent
from docoutbox.testing import (
    AsyncMemoryBackend,
    AsyncMemoryPublisher,
    MemoryBackend,
    MemoryDeadLetters,
    MemoryPublisher,
)
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints, MemoryLeaseTable

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Silent:
    """The product's no-lease ownership (:class:`SoleOwner`, every partition) less
    ``on_acquired``: an ownership that does not announce what it gains."""

    def __init__(self) -> None:
        self.sole = SoleOwner()

    def __getattr__(self, name: str) -> Any:
        if name == "on_acquired":
            raise AttributeError(name)
        return getattr(self.sole, name)


def engine(clock: Clock, ownership: Any = None, *, stream: bool = True, **options: Any) -> Any:
    settings: dict[str, Any] = {
        "poll_interval": 1 / 16,
        "sweep_interval": 60.0,
        "checkpoint_interval": 0,
        **options,
    }
    config = DispatcherConfig(name="idle", **settings)
    made = DispatchEngine(
        config,
        ownership or SoleOwner(),
        stream=stream,
        checkpoints=True,
        monotonic=clock,
        clock=lambda: NOW,
        rng=random.Random(0),
    )
    made.begin()
    return made


def turn(made: DispatchEngine, events: list[ChangeEvent] | None = None, fail: str = "") -> bool:
    """One turn; stream reads bring ``events`` (nothing if None), and the operation named
    ``fail`` raises a transient store error."""
    replies: dict[str, Any] = {
        "LoadCheckpoint": {"resume_after": {"_data": "0001"}},
        "FindPending": [],
    }
    flow = made.turn()
    try:
        op = next(flow)
        while True:
            name = type(op).__name__
            if name == fail:
                op = flow.throw(TransientStoreError(f"{name} failed"))
            else:
                op = flow.send((events or []) if name == "PollChanges" else replies.get(name))
    except StopIteration as done:
        return bool(done.value)


def test_an_idle_stream_sleeps_until_its_next_read_beyond_the_poll_interval() -> None:
    clock = Clock()
    made = engine(clock, max_stream_wait=1.0)
    turn(made)  # opens the stream
    turn(made)  # a read that brings nothing: the next is max_stream_wait away
    assert made.wake_in() == 1.0  # a second away, not a tick
    assert IdleWait(made, lambda: None).seconds() == 1.0
    clock.now = 5 / 16
    assert made.wake_in() == 11 / 16


def test_without_a_stream_the_loop_sleeps_until_the_next_sweep() -> None:
    clock = Clock()
    made = engine(clock, stream=False)
    turn(made)  # the first sweep: nothing pending
    assert not turn(made)
    clock.now = 20.0
    assert made.wake_in() == 40.0
    assert IdleWait(made, lambda: None).seconds() == 40.0


def test_a_stream_that_failed_to_open_is_retried_when_its_backoff_ends() -> None:
    clock = Clock()
    made = engine(clock)
    turn(made, fail="OpenStream")
    assert made.stream_open is False
    retry = made.wake_in()
    assert 0 < retry < 60.0
    clock.now = retry
    turn(made)
    assert made.stream_open is True


def test_a_checkpoint_held_back_by_its_interval_wakes_the_loop_when_it_may_be_saved() -> None:
    clock = Clock()
    made = engine(clock, poll_interval=4.0, max_stream_wait=8.0, checkpoint_interval=2.0)
    turn(made)  # opens the stream (from the stored position)
    position = {"resume_after": {"_data": "0002"}}
    made.tracker.add_event(position, lambda: True, None)
    turn(made)  # a quiet read; the position is saved, the next save from 2 s
    assert made.saved == position
    made.tracker.add_event({"resume_after": {"_data": "0003"}}, lambda: True, None)
    clock.now = 0.5
    turn(made)  # no read (4 s away); the new position waits for the interval
    assert made.saved == position
    assert made.wake_in() == 1.5  # the save, not the read
    clock.now = 2.0
    turn(made)
    assert made.saved == {"resume_after": {"_data": "0003"}}
    assert made.wake_in() == 6.0  # the read at 8 s (max_stream_wait: nothing came yet)


def test_a_failed_save_is_tried_again_at_the_next_wake_not_in_a_loop() -> None:
    clock = Clock()
    made = engine(clock, poll_interval=4.0, max_stream_wait=8.0, checkpoint_interval=2.0)
    turn(made)
    made.tracker.add_event({"resume_after": {"_data": "0003"}}, lambda: True, None)
    turn(made, fail="SaveCheckpoint")
    assert made.wake_in() == 8.0  # the next read, not 0


def test_an_ownership_that_does_not_announce_is_looked_at_every_poll_interval() -> None:
    clock = Clock()
    made = engine(clock, Silent(), max_stream_wait=1.0)
    turn(made)
    assert not isinstance(Silent(), AnnouncingOwnership)
    idle = IdleWait(made, lambda: None)
    assert not idle.announced
    assert idle.seconds() == 1 / 16


def test_an_idle_wait_is_never_zero() -> None:
    """A wait due now is one the turn could not act on: the loop sleeps a little."""
    clock = Clock()
    made = engine(clock, max_stream_wait=1.0)
    turn(made)
    clock.now = 100.0  # the periodic sweep is overdue
    assert made.wake_in() == 0.0
    assert IdleWait(made, lambda: None).seconds() == MIN_IDLE_WAIT


def test_a_lease_keeper_announces_each_heartbeat_that_gained_partitions() -> None:
    table = MemoryLeaseTable()
    mono = Clock()
    keeper = LeaseKeeper(
        table,
        partitions=4,
        owner="a",
        timing=LeaseTiming(ttl=9.0),
        clock=lambda: NOW + timedelta(seconds=mono.now),
        monotonic=mono,
        rng=random.Random(0),
    )
    woken: list[int] = []
    made = engine(Clock(), keeper)
    IdleWait(made, lambda: woken.append(1))
    assert isinstance(keeper, AnnouncingOwnership)
    keeper.tick()  # gains all four
    assert woken == [1]
    assert made.ownership.take_acquired() == [frozenset(range(4))]
    mono.now = 3.0
    keeper.tick()  # renews: nothing gained
    assert woken == [1]


def memory_dispatcher() -> tuple[Dispatcher, list[int]]:
    """A threaded dispatcher on memory ports whose stream reads are counted (its idle
    reads space out to 10 s: no read falls due by itself during a test)."""
    backend = MemoryBackend()
    source = MemoryChangeSource(backend)
    polls: list[int] = []
    poll = source.poll

    def counted(max_events: int) -> list[ChangeEvent]:
        polls.append(max_events)
        return poll(max_events)

    source.poll = counted  # type: ignore[method-assign]
    config = DispatcherConfig(name="nudged", poll_interval=10.0, max_stream_wait=10.0)
    made = Dispatcher(
        backend,
        MemoryPublisher(),
        MemoryDeadLetters(),
        source=source,
        checkpoints=MemoryCheckpoints(),
        config=config,
    )
    made.engine.begin()
    return made, polls


def test_a_nudged_threaded_dispatcher_reads_its_stream_at_its_next_turn() -> None:
    made, polls = memory_dispatcher()
    while made._turn():  # opens the stream, sweeps, reads it: nothing
        pass
    read = len(polls)
    assert read >= 1
    made._turn()
    assert len(polls) == read  # the next read is 10 s away
    made.nudge()
    assert made._wake.is_set()  # an idle loop wakes at once
    made._turn()
    assert len(polls) == read + 1
    made._turn()
    assert len(polls) == read + 1  # one nudge, one read


class ClosingLoop:
    """An event loop that closes between the check and the call."""

    def is_closed(self) -> bool:
        return False

    def call_soon_threadsafe(self, callback: Any) -> None:
        raise RuntimeError("Event loop is closed")


def test_a_partition_gained_as_the_async_loop_closes_does_not_break_the_heartbeat() -> None:
    backend = AsyncMemoryBackend()
    made = AsyncDispatcher(
        backend, AsyncMemoryPublisher(), in_thread(MemoryDeadLetters()), config=DispatcherConfig()
    )
    made._loop = ClosingLoop()  # type: ignore[assignment]
    made._wake_soon()  # the lease keeper's callback: nothing left to wake, no error
