"""The simulated dispatcher: the engine's design, one step at a time.

It is built like :class:`docoutbox.dispatch.dispatcher.Dispatcher`, with the same pure parts:

- change events enter a :class:`~docoutbox.dispatch.checkpoint.PositionTracker`, each with a
  completion check; the checkpoint saved is the tracker's ``safe`` position (I5);
- without a checkpoint it starts "fresh" as the engine does: it takes the log's end as
  the new position and sweeps every pending document behind a
  :class:`~docoutbox.dispatch.checkpoint.Gate` (I6); or, with ``recovery="replay"``, it replays the
  whole log;
- sweeps page through :meth:`Core.pending_page`; with no change log (``dispatcher="sweep"``)
  it sweeps again and again;
- each aggregate is published by :func:`~docoutbox.dispatch.flow.dispatch_document` on the
  document as loaded when its run starts. A run completes every request made before it
  started (the engine's tickets); a failed run is retried.

Runs are serial here (one aggregate at a time), so per-aggregate order (I4) is checked
against a single owner, as leases guarantee in production.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from docoutbox.dispatch.checkpoint import Gate, PositionTracker
from docoutbox.dispatch.flow import dispatch_document
from docoutbox.errors import StoreError
from docoutbox.model import AggregateId, InboxPolicy
from docoutbox.store.core import Core, Load
from docoutbox.store.document import ID
from tests.simulation.actors import (
    Env,
    Idle,
    LoadCheckpoint,
    LogEnd,
    Process,
    Producer,
    ReadChanges,
    SaveCheckpoint,
    Step,
)


@dataclass
class Sweep:
    """A paged scan of every document with pending entries, maybe behind a gate."""

    gate: Gate | None = None
    after: AggregateId | None = None


class Tickets:
    """Which aggregates need a run, and which requests a completed run satisfied."""

    def __init__(self) -> None:
        self.generation = 0
        self.requested: dict[AggregateId, int] = {}
        self.completed: dict[AggregateId, int] = {}

    def request(self, aggregate_id: AggregateId) -> Callable[[], bool]:
        self.generation += 1
        wanted = self.requested[aggregate_id] = self.generation
        return lambda: self.completed.get(aggregate_id, 0) >= wanted

    def due(self) -> list[AggregateId]:
        return [a for a, g in self.requested.items() if self.completed.get(a, 0) < g]

    def complete(self, aggregate_id: AggregateId, started: int) -> None:
        self.completed[aggregate_id] = max(self.completed.get(aggregate_id, 0), started)


class Dispatcher:
    """One dispatcher process's state; :meth:`process` is the process itself."""

    def __init__(self, env: Env, rng: random.Random) -> None:
        self.env = env
        self.rng = rng
        self.core: Core[Producer] = env.core(Producer, env.producers, InboxPolicy(), rng)
        self.follow = env.schedule.dispatcher == "log"
        self.tickets = Tickets()
        self.sweeps: deque[Sweep] = deque()
        self.tracker = PositionTracker()
        self.cursor = 0
        self.saved: int | None = None

    def process(self) -> Process:
        yield from self.start()
        while True:
            if not (yield from self.step()):
                yield Idle()

    def start(self) -> Step:
        if not self.follow:
            return
        self.saved = yield LoadCheckpoint()
        if self.saved is not None:
            self.tracker = PositionTracker(self.saved)
        elif self.env.schedule.recovery == "replay":
            self.env.stats["dispatcher.replay"] += 1
            self.tracker = PositionTracker(0)
        else:
            self.env.stats["dispatcher.fresh_start"] += 1
            marker = yield LogEnd()  # changes after it are followed; the sweep covers the rest
            gate = Gate()
            self.tracker.reset(marker, gate)
            self.sweeps.append(Sweep(gate))
        assert self.tracker.latest is not None
        self.cursor = self.tracker.latest

    def step(self) -> Step:
        """One turn of the engine's loop: a sweep page, new changes, one run, checkpoint."""
        busy = yield from self.sweep_page()
        if self.follow:
            busy = (yield from self.read_changes()) or busy
        due = self.tickets.due()
        if due:
            busy = True
            aggregate_id = due[self.rng.randrange(len(due))]
            started = self.tickets.generation
            if (yield from self.run(aggregate_id)):
                self.tickets.complete(aggregate_id, started)
        if self.follow and self.tracker.advance():
            safe = self.tracker.safe
            if isinstance(safe, int) and safe != self.saved:
                self.saved = safe
                yield SaveCheckpoint(safe)
        if not self.follow and not self.sweeps and not due:
            self.sweeps.append(Sweep())  # sweep again, next turn
        return busy

    def sweep_page(self) -> Step:
        if not self.sweeps:
            return False
        sweep = self.sweeps[0]
        try:
            page = yield from self.core.pending_page(
                sweep.after, self.env.schedule.batch, None, None
            )
        except StoreError:
            self.env.stats["dispatcher.store_error"] += 1
            return False
        for snapshot in page:
            done = self.tickets.request(snapshot.aggregate_id)
            if sweep.gate is not None:
                sweep.gate.add(done)
        if page:
            sweep.after = page[-1].aggregate_id
        if len(page) < self.env.schedule.batch:
            self.sweeps.popleft()
            self.env.stats["dispatch.sweep"] += 1
            if sweep.gate is not None:
                sweep.gate.finished = True
        return True

    def read_changes(self) -> Step:
        events = yield ReadChanges(self.cursor, self.env.schedule.batch)
        for doc in events:
            self.cursor += 1
            if doc.get("outbox"):
                self.tracker.add(self.cursor, self.tickets.request(doc[ID]))
            else:
                self.tracker.add(self.cursor)
        return bool(events)

    def run(self, aggregate_id: AggregateId) -> Step:
        """Publish and trim what the aggregate has pending now: True when done."""
        try:
            doc = yield Load(aggregate_id)
            if doc is None or not doc.get("outbox"):
                return True
            result = yield from dispatch_document(doc, self.env.dispatch_policy, self.rng)
        except StoreError:
            self.env.stats["dispatcher.store_error"] += 1
            return False
        self.env.stats["dispatch.pass"] += 1
        self.env.stats["dispatch.held"] += bool(result.held)
        assert result.aggregate_id == doc[ID]
        return not result.unavailable


def dispatcher(env: Env, rng: random.Random) -> Process:
    return Dispatcher(env, rng).process()
