"""The simulation's driver of the library's dispatch engine.

The dispatcher process is :class:`docoutbox.dispatch.engine.loop.DispatchEngine` itself, with
the simulated clock and a seeded ``rng``; this module only performs its operations, as
the threaded and asyncio drivers do, one operation per simulation step:

- the engine's control turns (sweep pages, change-log reads, checkpoints) and its
  batches of aggregate runs are tasks; each step advances one task picked at random, so
  runs of several aggregates interleave with each other and with the control loop (at
  most ``concurrency`` batches of at most ``run_batch`` runs at once, both chosen per
  incarnation); a batch's :class:`~docoutbox.dispatch.engine.loop.TrimRound` is performed as
  one write per trim, each a step; a :class:`~docoutbox.dispatch.engine.loop.PublishRound`
  as one publish per entry, each a step, and the outcomes reach the engine only after
  the last: every entry of the round is sent before any confirm is seen (a pipelining
  publisher), so a crash or a fault can fall between the publishes of a round, or
  between their confirms and the trims;
- trims are deferred (:mod:`~docoutbox.dispatch.engine.deferred`) in most schedules, with
  a delay and a bound drawn per incarnation (a bound of a few entries, so runs also reach
  it and write their own): a flush is one more task, started when the engine says one is
  due, whose writes are steps like any other, so crashes, faults and business writes fall
  between a publish, its confirm and its deferred trim;
- a task's :class:`~docoutbox.store.core.Sleep` parks only that task;
- an error the world injects is thrown into the task at its ``yield``, so the engine
  decides what it means.

With ``dispatcher="log"`` the engine follows the producers' change log and checkpoints;
with ``dispatcher="sweep"`` it has no change source and sweeps periodically.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.flow import Publish
from docoutbox.dispatch.engine.loop import (
    DispatchEngine,
    DispatcherConfig,
    PublishRound,
    TrimRound,
)
from docoutbox.dispatch.engine.metrics import NullMetrics
from docoutbox.dispatch.engine.scheduler import RunOutcome, RunSlot
from docoutbox.errors import StoreError
from docoutbox.ports.store import DueBackend
from docoutbox.retry import Backoff
from docoutbox.store.core import Sleep, Write
from tests.simulation.actors import Env, Idle, Process
from tests.simulation.schedule import CODEC

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass
class Task:
    flow: Generator[Any, Any, Any]
    slots: list[RunSlot] | None  # None: a control turn
    op: Any = None
    wake_at: float = 0.0
    done: bool = False
    result: Any = None


def config(env: Env, rng: random.Random) -> DispatcherConfig:
    s = env.schedule
    follow = s.dispatcher == "log"
    # The deferred trims are drawn apart, so every other draw of a seed stays what it was.
    env.stats["dispatcher.started"] += 1
    trims = random.Random(f"{s.seed}/trims/{env.stats['dispatcher.started']}")
    return DispatcherConfig(
        name="sim",
        concurrency=rng.randint(1, 3),
        run_batch=rng.randint(1, 3),
        # Several trims per run in some schedules, so a flush can fall between them.
        policy=replace(env.dispatch_policy, trim_every=trims.choice((1, 2, 100, 100))),
        # Following a log: sweeps only behind a fresh start. Without one: sweep often.
        sweep_interval=10_000.0 if follow else 0.01,
        grace=0.0,
        batch_size=s.batch,
        sweep_page=s.batch,
        max_outstanding=1_000_000,
        max_backlog=1_000_000,
        checkpoint_interval=0.0,
        backoff=Backoff(base=0.005, cap=0.05),
        max_stream_wait=s.stream_wait_ms / 1000 or None,
        codec=CODEC if s.encoded else None,
        due_interval=0.05,
        trim_delay=trims.choice((0.0, 0.001, 0.01, 0.05)),
        max_untrimmed=trims.randint(1, 6),
    )


def dispatcher(env: Env, rng: random.Random) -> Process:
    follow = env.schedule.dispatcher == "log"

    def now() -> float:
        return (env.clock() - EPOCH).total_seconds()

    engine = DispatchEngine(
        config(env, rng),
        SoleOwner(),
        stream=follow,
        checkpoints=follow,
        monotonic=now,
        clock=env.clock,
        rng=rng,
        metrics=NullMetrics(),
    )
    # A publisher with confirms in flight (rounds), or one that confirms each publish
    # before it returns (each run publishes in turn): each schedule draws one.
    engine.rounds = rng.random() < 0.75
    # Scheduled entries fallen due are queried for where the store can answer.
    engine.due_scans = isinstance(env.producers, DueBackend)
    engine.begin()
    env.untrimmed = engine.trims_pending
    env.trim_deferred = engine.trim_deferred
    cfg = engine.config
    control: Task | None = None
    flush: Task | None = None
    runs: list[Task] = []
    while True:
        if control is None:
            control = _begin(Task(engine.turn(), None))
        if flush is not None and flush.done:
            env.stats["dispatch.trims_flushed"] += bool(flush.result)
            flush = None
        if flush is None and engine.trims_due():
            flush = _begin(Task(engine.flush_trims(), None))
        free = cfg.concurrency - len(runs)
        if free > 0:
            for batch in engine.start_batches(free):
                runs.append(_begin(Task(engine.run_batch(batch), batch)))
        quiet = False
        if control.done:  # a turn that performed nothing is never busy
            quiet, control = not control.result, None
        for task in [t for t in runs if t.done]:
            runs.remove(task)
            assert task.slots is not None
            outcomes: list[RunOutcome] = task.result
            for slot, outcome in zip(task.slots, outcomes, strict=True):
                env.stats["dispatch.pass"] += outcome is RunOutcome.DONE
                env.stats["dispatch.held"] += outcome is RunOutcome.UNAVAILABLE
                engine.finish(slot, outcome)
        tasks = [*runs, *(t for t in (control, flush) if t is not None)]
        awake = [t for t in tasks if not t.done and t.wake_at <= now()]
        if awake:
            task = awake[rng.randrange(len(awake))]
            if task.slots is not None and isinstance(task.op, TrimRound) and engine.deferred:
                env.stats["dispatch.trims_at_bound"] += 1  # a run writes its own trim
            yield from _advance(env, task, now)
            if engine.trims_pending() > cfg.max_untrimmed:
                env.violation(
                    "untrimmed-bound",
                    f"{engine.trims_pending()} entries wait for a deferred trim, over "
                    f"max_untrimmed={cfg.max_untrimmed}",
                )
        elif runs:
            yield Sleep(max(0.001, min(t.wake_at for t in runs) - now()))
        elif quiet:
            yield Idle()


def _begin(task: Task) -> Task:
    return _send(task, None, None)


def _send(task: Task, value: Any, error: Exception | None) -> Task:
    try:
        task.op = task.flow.send(value) if error is None else task.flow.throw(error)
    except StopIteration as stop:
        task.done, task.result = True, stop.value
    return task


def _advance(env: Env, task: Task, now: Any) -> Generator[Any, Any, None]:
    """Perform the task's pending operation (one step), then run it to its next one."""
    op = task.op
    if isinstance(op, Sleep):
        task.wake_at = now() + op.seconds
        task.op = None
        _send(task, None, None)
        return
    if isinstance(op, PublishRound):
        env.stats[f"dispatch.round.{min(len(op.entries), 3)}"] += 1
        published: list[Exception | None] = []
        for entry in op.entries:
            try:
                yield Publish(entry)
            except Exception as exc:
                published.append(exc)
            else:
                published.append(None)
        _send(task, published, None)
        return
    if isinstance(op, TrimRound):
        outcomes: list[Any] = []
        for plan in op.plans:
            try:
                outcomes.append((yield Write(plan)))
            except Exception as exc:
                if isinstance(exc, StoreError):
                    env.stats["dispatcher.store_error"] += 1
                outcomes.append(exc)
        _send(task, outcomes, None)
        return
    try:
        value = yield op
    except Exception as exc:
        if isinstance(exc, StoreError):
            env.stats["dispatcher.store_error"] += 1
        _send(task, None, exc)
        return
    _send(task, value, None)
