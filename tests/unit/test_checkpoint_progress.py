"""The checkpoint keeps advancing while producers commit continuously, without ever passing
an event whose entries are not yet published (I5).

Traffic goes to a handful of hot aggregates, whose requests keep arriving while their runs
are under way (so a ticket waits behind coalesced follow-up runs), and to new aggregates,
which a sweep keeps finding. Checked here on the in-memory backend and change log,
deterministically, with the engine stepped on a simulated clock, runs finishing one to
three steps after they start, from a saved checkpoint and from a fresh start behind a
sweep's gate (with a backlog to sweep).

The threaded and asyncio dispatchers on the wall clock, over the same world, are in
``tests/integration/test_checkpoint_progress_memory.py``; the integration twins (MongoDB
wire server, Cosmos DB feed-range leases) in ``tests/integration/test_checkpoint_progress.py``.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.operations import Ports
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig
from docoutbox.dispatch.engine.scheduler import AggregateQueue, RunOutcome, RunSlot
from docoutbox.drive import drive
from docoutbox.ports.dispatch import Ownership, Position
from docoutbox.store.core import Sleep
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints

HOT = ["hot0", "hot1", "hot2"]


class World:
    """A memory backend and change log, producers, and checkpoints that check I5."""

    def __init__(self) -> None:
        self.backend = MemoryBackend()
        self.store = AggregateStore(self.backend, Counter)
        self.source = MemoryChangeSource(self.backend)
        self.publisher = MemoryPublisher()
        self.dead = MemoryDeadLetters()
        self.checkpoints = CheckedCheckpoints(self)

    def write(self, aggregate_id: str, message_id: str) -> None:
        outcome = self.store.handle(
            aggregate_id, add_msg(message_id), counter_handlers, create=True
        )
        assert outcome.applied

    def backlog(self, count: int) -> None:
        """``count`` documents with a pending entry, written before any dispatcher runs."""
        for i in range(count):
            self.write(f"aged{i:04d}", f"aged-{i}")


class CheckedCheckpoints(MemoryCheckpoints):
    """Records a violation if a saved position passes a change whose entries are still
    pending (I5)."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.violations: list[str] = []
        self._checked = 0

    def save(self, name: str, position: Position) -> None:
        assert isinstance(position, int)
        published = set(self.world.publisher.ids())
        for doc in self.world.backend.changes[self._checked : position]:
            for entry in doc.get("outbox") or []:
                if entry["id"] not in published:
                    self.violations.append(f"{position}: {entry['id']} not published")
        self._checked = max(self._checked, position)
        super().save(name, position)

    def resume_at(self, position: int) -> None:
        """Start from ``position``, as if saved earlier (what precedes it is not checked)."""
        self.positions["d"] = self._checked = position

    def saved(self) -> int:
        position = self.load("d")
        return position if isinstance(position, int) else -1


def test_a_ticket_of_a_hot_aggregate_is_done_after_two_runs_while_requests_keep_coming() -> None:
    """Requests arriving during every run are coalesced into one follow-up run; a ticket
    waits for the first run that started after it, never for the aggregate to go idle."""
    queue = AggregateQueue(workers=1)
    queue.request("hot", 0)
    (running,) = queue.start(0.0)
    ticket = queue.request("hot", 0)  # an event of the aggregate while its run is under way
    queue.finish(running, RunOutcome.DONE, 0.0)
    assert not queue.done(ticket)  # that run started before the request
    runs = 0
    while not queue.done(ticket):
        (slot,) = queue.start(0.0)
        queue.request("hot", 0)  # the next commit arrives during every run
        queue.finish(slot, RunOutcome.DONE, 0.0)
        runs += 1
        assert runs <= 1, "the ticket waits behind follow-up runs"
    assert not queue.idle()  # the aggregate never went idle meanwhile


# -- the engine on a simulated clock --------------------------------------------------

STEP = 0.01
INTERVAL = 0.1
#: How many steps the checkpoint may take to pass a mark: six checkpoint intervals.
STEPS_BOUND = 60


class Stepper:
    """Steps the engine: each step commits a few commands, takes one control turn, runs
    the runs that are due, and starts new ones that finish one to three steps later (so
    requests keep arriving for aggregates whose run is under way)."""

    def __init__(
        self, world: World, seed: int, concurrency: int, ownership: Ownership | None = None
    ) -> None:
        self.world = world
        self.rng = random.Random(seed)
        self.now = 0.0
        self.ports = Ports(
            world.backend, world.publisher, world.dead, world.source, world.checkpoints
        )
        config = DispatcherConfig(
            name="d",
            concurrency=concurrency,
            run_batch=1,  # each run here is one aggregate's, stepped on its own
            poll_interval=STEP,
            checkpoint_interval=INTERVAL,
            sweep_interval=3600,
            grace=0,
            # A tenth of the defaults, as runs here are slow: a run takes two steps.
            sweep_page=20,
            batch_size=50,
            max_backlog=100,
        )
        self.engine = DispatchEngine(
            config,
            ownership or SoleOwner(),
            stream=True,
            checkpoints=True,
            monotonic=lambda: self.now,
            clock=lambda: datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=self.now),
            rng=random.Random(seed),
        )
        self.engine.begin()
        self.inflight: list[tuple[RunSlot, int]] = []
        self.step_no = 0
        self.commands = 0

    def _perform(self, op: Any) -> Any:
        if isinstance(op, Sleep):
            self.now += op.seconds
            return None
        return self.ports.perform(op)

    def step(self) -> None:
        self.step_no += 1
        self.now += STEP
        for _ in range(self.rng.randint(0, 4)):
            self.commands += 1
            hot = self.rng.random() < 0.8
            # New IDs sort after every earlier one: a sweep keeps finding new documents
            # ahead of its cursor (the backlog's "aged" IDs and the hot ones sort first).
            aggregate_id = self.rng.choice(HOT) if hot else f"new{self.commands:06d}"
            self.world.write(aggregate_id, f"m{self.commands}")
        drive(self.engine.turn(), self._perform)
        if self.engine.trims_due():
            drive(self.engine.flush_trims(), self._perform)
        waiting = []
        for slot, due in self.inflight:
            if due <= self.step_no:
                self.engine.finish(slot, drive(self.engine.run(slot), self._perform))
            else:
                waiting.append((slot, due))
        started = [(s, self.step_no + self.rng.randint(1, 3)) for s in self.engine.start_runs()]
        self.inflight = waiting + started


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("start", ["resumed", "fresh"])
def test_the_engine_checkpoint_passes_every_mark_within_a_few_intervals(
    seed: int, start: str
) -> None:
    world = World()
    if start == "resumed":
        world.checkpoints.resume_at(0)  # resume from the start of the log
    else:
        world.backlog(50)  # a fresh start sweeps it behind a gate
    # Enough workers to keep up on average (a run takes two steps on average): an
    # overloaded dispatcher rightly holds its checkpoint back.
    stepper = Stepper(world, seed, concurrency=(6, 8, 16)[seed % 3])
    for _ in range(20):
        stepper.step()
    for _ in range(8):
        world.write(f"mark{len(world.backend.changes)}", "m")  # each mark is past the last
        mark, marked_at = len(world.backend.changes), stepper.step_no
        while world.checkpoints.saved() < mark:
            assert stepper.step_no - marked_at < STEPS_BOUND, (
                f"the checkpoint stayed at {world.checkpoints.saved()} for "
                f"{STEPS_BOUND * STEP:.2f} s (interval {INTERVAL} s) behind mark {mark}; "
                f"{len(stepper.engine.tracker)} events held, "
                f"{len(stepper.engine.sweeps)} sweeps under way"
            )
            stepper.step()
    assert world.checkpoints.violations == []
    assert len(world.checkpoints.history) >= 8


class Acquiring(SoleOwner):
    """Owns everything, and reports every partition acquired once asked to (as a lease
    keeper does on taking partitions over), so the engine sweeps them."""

    def __init__(self) -> None:
        self.acquired: list[frozenset[int] | None] = []

    def take_acquired(self) -> list[frozenset[int] | None]:
        taken, self.acquired = self.acquired, []
        return taken


@pytest.mark.parametrize("seed", range(3))
def test_a_long_sweep_does_not_keep_the_stream_unread(seed: int) -> None:
    """A sweep of partitions just acquired, with a large backlog, while producers keep
    committing: the stream is read meanwhile, so the checkpoint keeps passing marks (and
    the hot aggregates' new entries, behind the sweep's cursor, are not held up)."""
    world = World()
    world.backlog(1500)
    # Leases taken for the first time resume from "now" and sweep what is pending.
    world.checkpoints.resume_at(len(world.backend.changes))
    ownership = Acquiring()
    ownership.acquired.append(None)
    stepper = Stepper(world, seed, concurrency=8, ownership=ownership)
    for _ in range(10):
        stepper.step()
    assert stepper.engine.sweeps
    for _ in range(4):
        world.write(f"mark{len(world.backend.changes)}", "m")  # each mark is past the last
        mark, marked_at = len(world.backend.changes), stepper.step_no
        while world.checkpoints.saved() < mark:
            assert stepper.step_no - marked_at < STEPS_BOUND, (
                f"the checkpoint stayed at {world.checkpoints.saved()} behind mark {mark} "
                f"for {STEPS_BOUND * STEP:.2f} s (interval {INTERVAL} s) while a sweep of "
                f"{stepper.engine.sweeps[0].pages if stepper.engine.sweeps else '?'} pages "
                "went on"
            )
            stepper.step()
    assert stepper.engine.sweeps, "the sweep ended before the marks: nothing was shown"
    assert world.checkpoints.violations == []
