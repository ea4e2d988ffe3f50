"""The simulator: runs one schedule's processes step by step and injects faults.

Each step picks a runnable process at random (seeded), then either kills it (``crash``:
its generator is dropped mid-flight and its unacknowledged deliveries return to their
queue; it restarts as a new process, with an empty cache, some steps later) or has the
:class:`~tests.simulation.world.World` perform its pending operation. An error the
operation raises is thrown into the process at its ``yield``, so the library's own
flows decide what to do with it.

After ``fault_steps`` steps every fault stops and the run continues until it is
quiescent: every command and delivery acknowledged, every outbox empty, the checkpoint
at the end of the change log. Then :mod:`tests.simulation.invariants` checks the result.
"""

from __future__ import annotations

import logging
import random
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox.errors import DocOutboxError
from docoutbox.ports.store import StoreBackend
from docoutbox.store.core import Sleep, Write
from tests.simulation import actors
from tests.simulation.actors import Env, Idle, Process, Receive, SimOp
from tests.simulation.claims import SLOW_PUT_MS
from tests.simulation.dispatcher import dispatcher
from tests.simulation.invariants import Violation, check
from tests.simulation.mutations import applied
from tests.simulation.schedule import Schedule, Variant
from tests.simulation.stores import Stores, cosmos_stores, memory_stores, wire_stores
from tests.simulation.trace import describe
from tests.simulation.world import BLOCKED, World

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
#: Fault-free steps allowed to reach quiescence; a run still busy after them is stuck.
QUIET_STEPS = 20_000

Program = Callable[[Env, random.Random], Process]


@dataclass(frozen=True)
class Returning:
    """An operation performed whose result reaches its process only when it wakes."""

    value: Any


class Actor:
    """One simulated process and its current incarnation."""

    def __init__(self, name: str, side: str, backend: StoreBackend, program: Program) -> None:
        self.name = name
        #: "producers", "consumers" or "dispatcher": the workers of a side may share a store.
        self.side = side
        self.backend = backend
        self.program = program
        self.incarnation = 0
        self.process: Process | None = None
        self.op: SimOp | Returning = Idle()
        self.wake_at = 0


@dataclass
class Report:
    variant: Variant
    schedule: Schedule
    violations: list[Violation]
    stats: Counter[str]
    steps: int
    trace: list[str] | None

    @property
    def ok(self) -> bool:
        return not self.violations

    def describe(self, limit: int = 8) -> str:
        v = self.variant
        lines = [f"seed {v.seed} ({v.store}): {len(self.violations)} violation(s)"]
        lines += [f"  {violation}" for violation in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        lines.append(f"  replay: {v.command()} --trace")
        return "\n".join(lines)


class Simulator:
    def __init__(self, variant: Variant, stores: Stores, *, trace: bool = False) -> None:
        self.variant = variant
        self.schedule = s = variant.schedule()
        self.rng = random.Random(f"{s.seed}/scheduler")
        self.stats: Counter[str] = Counter()
        self.world = World(s, stores, self.stats)
        self.env = Env(s, stores.producers, stores.sinks, self.clock, self.stats)
        self.env.violation = self.world.violation
        self.world.trim_deferred = lambda aggregate_id: self.env.trim_deferred(aggregate_id)
        self.trace: list[str] | None = [] if trace else None
        self.actors = [
            *(
                Actor(f"producer{i}", "producers", stores.producers, actors.producer)
                for i in range(1, s.producer_workers + 1)
            ),
            *(
                Actor(f"consumer{i}", "consumers", stores.sinks, actors.consumer)
                for i in range(1, s.consumer_workers + 1)
            ),
            Actor("dispatcher", "dispatcher", stores.producers, dispatcher),
        ]
        self.env.payloads = self.world.payloads
        if s.claimed:
            self.actors.append(Actor("sweeper", "sweeper", stores.producers, actors.sweeper))

    def clock(self) -> datetime:
        return EPOCH + timedelta(milliseconds=self.world.now)

    def run(self) -> Report:
        s, world = self.schedule, self.world
        world.issue_commands()
        for actor in self.actors:
            self._start(actor)
        steps = 0
        while True:
            world.faulty = steps < s.fault_steps
            if world.quiescent():
                break
            if steps >= s.fault_steps + QUIET_STEPS:
                world.violation("liveness", f"not quiescent after {steps} steps: {world.busy()}")
                break
            runnable = [a for a in self.actors if a.wake_at <= world.now]
            if not runnable:
                world.now = min(a.wake_at for a in self.actors)
                continue
            self._step(self.rng.choice(runnable))
            steps += 1
            world.now += 1
        self.stats["steps"] += steps
        stores = world.stores
        producers = {pid: stores.producers.load(pid) for pid in world.producer_ids}
        sinks = {sid: stores.sinks.load(sid) for sid in world.sink_ids}
        violations = [*world.record.violations, *check(world.record, producers, sinks)]
        return Report(self.variant, s, violations, self.stats, steps, self.trace)

    def _start(self, actor: Actor) -> None:
        actor.incarnation += 1
        rng = random.Random(f"{self.schedule.seed}/{actor.name}/{actor.incarnation}")
        actor.process = actor.program(self.env, rng)
        actor.op = next(actor.process)

    def _restart(self, actor: Actor) -> None:
        """Kill the process running ``actor`` (with its sibling threads, if it has some)."""
        victims = [actor]
        if self.schedule.shared_store and actor.side in self.env.shared:
            del self.env.shared[actor.side]
            victims = [a for a in self.actors if a.side == actor.side]
        for victim in victims:
            assert victim.process is not None
            victim.process.close()
            for queue in self.world.queues.values():
                released = queue.release(victim.name, self.world.now)
                self.stats["redelivery.after_crash"] += released
        if actor.name == "dispatcher" and self.world.fault("checkpoint_lost"):
            self.world.checkpoint = None
        delay = self.rng.randint(1, 20)
        for victim in victims:
            self._start(victim)
            victim.wake_at = self.world.now + delay

    def _wait(self, actor: Actor, low: int, high: int) -> None:
        actor.wake_at = self.world.now + self.rng.randint(low, high)

    def _step(self, actor: Actor) -> None:
        op = actor.op
        if isinstance(op, Returning):
            return self._resume(actor, op.value, None)
        if isinstance(op, Idle):
            self._wait(actor, 3, 12)
            return self._resume(actor, None, None)
        if isinstance(op, Sleep):
            actor.wake_at = self.world.now + max(1, round(op.seconds * 1000))
            return self._resume(actor, None, None)
        if not isinstance(op, Receive) and self.world.fault("crash"):
            self.stats[f"crash.{_kind(op)}"] += 1
            if actor.name == "dispatcher" and self.env.untrimmed():
                self.stats["crash.trims_deferred"] += 1  # published, the trim not yet written
            self._note(actor, op, "CRASH")
            return self._restart(actor)
        try:
            result = self.world.perform(actor.name, actor.backend, op)
        except DocOutboxError as exc:
            self._note(actor, op, f"raises {type(exc).__name__}: {exc}")
            return self._resume(actor, None, exc)
        if result is BLOCKED:
            return self._wait(actor, 2, 8)
        self._note(actor, op, result)
        if self.world.claims.take_slow():
            # The put returns only then: the process resumes (and reads the clock) later.
            actor.op = Returning(result)
            actor.wake_at = self.world.now + SLOW_PUT_MS
            return None
        return self._resume(actor, result, None)

    def _resume(self, actor: Actor, value: Any, error: BaseException | None) -> None:
        assert actor.process is not None
        try:
            if error is None:
                actor.op = actor.process.send(value)
            else:
                actor.op = actor.process.throw(error)
        except Exception as exc:  # no fault explains it: report, then restart the process
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.world.violation(
                "unexpected-error",
                f"{actor.name} raised {exc!r} at {where.filename}:{where.lineno}",
            )
            self._restart(actor)

    def _note(self, actor: Actor, op: SimOp, outcome: object) -> None:
        if self.trace is not None:
            text = outcome if isinstance(outcome, str) else describe(outcome)
            self.trace.append(f"{self.world.now:6d} {actor.name:<11} {describe(op)} => {text}")


def _kind(op: SimOp) -> str:
    return f"Write.{type(op.plan).__name__}" if isinstance(op, Write) else type(op).__name__


def run_schedule(variant: Variant, *, client: Any = None, trace: bool = False) -> Report:
    """Run one schedule on fresh stores (``client``: a pymongo client for the wire store, a
    Cosmos ``DatabaseProxy`` for the cosmos store)."""
    if variant.store != "memory" and client is None:
        raise ValueError(f"the {variant.store} store needs a client")
    if variant.store == "memory":
        stores = memory_stores()
    elif variant.store == "cosmos":
        stores = cosmos_stores(client, variant.seed)
    else:
        stores = wire_stores(client, variant.seed)
    try:
        with applied(variant.mutation), quiet_library():
            return Simulator(variant, stores, trace=trace).run()
    finally:
        stores.close()


@contextmanager
def quiet_library() -> Iterator[None]:
    """The library's own log lines (every injected fault makes one) are noise here, and
    formatting them would cost the schedules a quarter of their time."""
    logger = logging.getLogger("docoutbox")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
