"""The simulator: runs one schedule's processes step by step and injects faults.

Each step picks a runnable process at random (seeded), then either kills it (``crash``:
its generator is dropped mid-flight and its unacknowledged deliveries return to their
queue; it restarts as a new process with an empty cache) or performs its pending
operation. An operation can fail before it happens, or happen and then fail (a write
whose reply is lost, a publish whose confirm is lost); the error is thrown into the
process at its ``yield``, so the library's own flows decide what to do.

After ``fault_steps`` steps every fault stops and the run continues until it is
quiescent: every command and delivery acknowledged, every outbox empty, the checkpoint
at the end of the change log. Then :mod:`tests.simulation.invariants` checks the result.
"""

from __future__ import annotations

import random
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox.dispatch import Publish, Quarantine, decode_entry, encode_entry
from docoutbox.document import Document
from docoutbox.errors import (
    BrokerUnavailable,
    DocOutboxError,
    PermanentPublishError,
    PublishError,
    TransientStoreError,
)
from docoutbox.flows import FindPending, Load, Sleep, Write
from docoutbox.model import Message
from docoutbox.plan import CommitPlan, InsertPlan, TrimPlan, WritePlan
from docoutbox.ports import StoreBackend
from docoutbox.testing import MemoryDeadLetters
from tests.simulation import actors
from tests.simulation.actors import (
    COMMANDS,
    DELIVERIES,
    Ack,
    Command,
    Env,
    Idle,
    LoadCheckpoint,
    LogEnd,
    Nack,
    Process,
    ReadChanges,
    Receive,
    SaveCheckpoint,
    SimOp,
)
from tests.simulation.dispatcher import dispatcher
from tests.simulation.invariants import Record, Violation, check
from tests.simulation.mutations import applied
from tests.simulation.queues import Delivery, Queue
from tests.simulation.schedule import Schedule, Variant
from tests.simulation.stores import Stores, memory_stores, wire_stores

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
#: Fault-free steps allowed to reach quiescence; a run still busy after them is stuck.
QUIET_STEPS = 20_000
_BLOCKED = object()

Program = Callable[[Env, random.Random], Process]


class Actor:
    """One simulated process and its current incarnation."""

    def __init__(self, name: str, backend: StoreBackend, program: Program) -> None:
        self.name = name
        self.backend = backend
        self.program = program
        self.incarnation = 0
        self.process: Process | None = None
        self.op: SimOp = Idle()
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
        self.stores = stores
        self.rng = random.Random(f"{s.seed}/scheduler")
        self.fault_rng = random.Random(f"{s.seed}/faults")
        self.now = 0
        self.faulty = True
        self.stats: Counter[str] = Counter()
        self.record = Record()
        self.dead_letters = MemoryDeadLetters()
        self.published_ids: set[str] = set()
        self.checkpoint: int | None = None
        self.trace: list[str] | None = [] if trace else None
        self.queues: dict[str, Queue[Any]] = {
            name: Queue(name, random.Random(f"{s.seed}/{name}"), reorder=s.reorder)
            for name in (COMMANDS, DELIVERIES)
        }
        self.env = Env(s, stores.producers, stores.sinks, self.clock, self.stats)
        self.producer_ids = [f"p{i}" for i in range(1, s.producers + 1)]
        self.sink_ids = [f"c{i}" for i in range(1, s.consumers + 1)]
        self.actors = [
            *(
                Actor(f"producer{i}", stores.producers, actors.producer)
                for i in range(1, s.producer_workers + 1)
            ),
            *(
                Actor(f"consumer{i}", stores.sinks, actors.consumer)
                for i in range(1, s.consumer_workers + 1)
            ),
            Actor("dispatcher", stores.producers, dispatcher),
        ]

    def clock(self) -> datetime:
        return EPOCH + timedelta(milliseconds=self.now)

    # -- running ---------------------------------------------------------------------

    def run(self) -> Report:
        s = self.schedule
        self._issue_commands()
        for actor in self.actors:
            self._start(actor)
        steps = 0
        while True:
            self.faulty = steps < s.fault_steps
            if self._quiescent():
                break
            if steps >= s.fault_steps + QUIET_STEPS:
                self._violation("liveness", f"not quiescent after {steps} steps: {self._busy()}")
                break
            runnable = [a for a in self.actors if a.wake_at <= self.now]
            if not runnable:
                self.now = min(a.wake_at for a in self.actors)
                continue
            self._step(self.rng.choice(runnable))
            steps += 1
            self.now += 1
        self.stats["steps"] += steps
        producers = {pid: self.stores.producers.load(pid) for pid in self.producer_ids}
        sinks = {sid: self.stores.sinks.load(sid) for sid in self.sink_ids}
        violations = [*self.record.violations, *check(self.record, producers, sinks)]
        return Report(self.variant, s, violations, self.stats, steps, self.trace)

    def _issue_commands(self) -> None:
        s = self.schedule
        rng = random.Random(f"{s.seed}/clients")
        for pid in self.producer_ids:
            for j in range(1, s.commands + 1):
                count = rng.randint(0, s.max_targets)
                targets = tuple(rng.choice(self.sink_ids) for _ in range(count))
                message = Message(
                    id=f"cmd-{pid}-{j}",
                    type="Work",
                    payload={"targets": list(targets)},
                    source=f"client/{pid}",
                    seq=j,
                )
                command = Command(pid, message, targets)
                self.record.commands.append(command)
                self._send(COMMANDS, command, rng.randint(0, s.fault_steps * 2 // 3))

    def _send(self, queue: str, body: Any, visible_at: int) -> None:
        if self._fault("delay"):
            visible_at += self.fault_rng.randint(1, 40)
        self.queues[queue].put(body, visible_at)
        if self._fault("duplicate"):
            self.queues[queue].put(body, visible_at + self.fault_rng.randint(0, 30))

    def _quiescent(self) -> bool:
        if not all(q.idle() for q in self.queues.values()):
            return False
        if self.schedule.dispatcher == "log" and self.checkpoint != len(self._log()):
            return False
        return not self.stores.producers.find_pending(after=None, limit=1)

    def _busy(self) -> str:
        queues = {name: q.counts() for name, q in self.queues.items()}
        pending = [d["_id"] for d in self.stores.producers.find_pending(after=None, limit=10)]
        log = (
            f", log {self.checkpoint}/{len(self._log())}"
            if self.schedule.dispatcher == "log"
            else ""
        )
        return f"(waiting, in flight) {queues}, pending {pending}{log}"

    def _log(self) -> list[Document]:
        assert self.stores.changes is not None, "this store keeps no change log"
        return self.stores.changes

    def _fault(self, kind: str) -> bool:
        p = self.schedule.fault(kind) if self.faulty else 0.0
        if p and self.fault_rng.random() < p:
            self.stats[f"fault.{kind}"] += 1
            return True
        return False

    def _violation(self, invariant: str, detail: str) -> None:
        self.record.violations.append(Violation(invariant, detail))

    # -- processes -------------------------------------------------------------------

    def _start(self, actor: Actor) -> None:
        actor.incarnation += 1
        rng = random.Random(f"{self.schedule.seed}/{actor.name}/{actor.incarnation}")
        actor.process = actor.program(self.env, rng)
        actor.op = next(actor.process)

    def _restart(self, actor: Actor) -> None:
        assert actor.process is not None
        actor.process.close()
        for queue in self.queues.values():
            self.stats["redelivery.after_crash"] += queue.release(actor.name, self.now)
        if actor.name == "dispatcher" and self._fault("checkpoint_lost"):
            self.checkpoint = None
        self._start(actor)
        actor.wake_at = self.now + self.rng.randint(1, 20)

    def _step(self, actor: Actor) -> None:
        op = actor.op
        if not isinstance(op, Idle | Receive) and self._fault("crash"):
            self.stats[f"crash.{_kind(op)}"] += 1
            self._note(actor, op, "CRASH")
            self._restart(actor)
            return
        try:
            result = self._perform(actor, op)
        except DocOutboxError as exc:
            if self.trace is not None:
                self._note(actor, op, f"raises {type(exc).__name__}: {exc}")
            self._resume(actor, None, exc)
            return
        if result is not _BLOCKED:
            if self.trace is not None:
                self._note(actor, op, _describe(result))
            self._resume(actor, result, None)

    def _resume(self, actor: Actor, value: Any, error: BaseException | None) -> None:
        assert actor.process is not None
        try:
            if error is None:
                actor.op = actor.process.send(value)
            else:
                actor.op = actor.process.throw(error)
        except Exception as exc:  # no fault explains it: report, then restart the process
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self._violation(
                "unexpected-error",
                f"{actor.name} raised {exc!r} at {where.filename}:{where.lineno}",
            )
            self._restart(actor)

    def _note(self, actor: Actor, op: SimOp, outcome: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now:6d} {actor.name:<11} {_describe(op)} => {outcome}")

    # -- operations ------------------------------------------------------------------

    def _perform(self, actor: Actor, op: SimOp) -> Any:
        match op:
            case Receive(queue=name):
                delivery = self.queues[name].take(self.now, actor.name)
                if delivery is None:
                    return self._wait(actor, 2, 8)
                self.stats[f"{name}.redelivered"] += delivery.redelivered
                return delivery
            case Ack(queue=name, tag=tag):
                self.queues[name].ack(tag)
            case Nack(queue=name, tag=tag):
                self.queues[name].nack(tag, self.now)
            case Idle():
                actor.wake_at = self.now + self.rng.randint(3, 12)
            case Sleep(seconds=seconds):
                actor.wake_at = self.now + max(1, round(seconds * 1000))
            case Load(aggregate_id=aggregate_id):
                if self._fault("load_error"):
                    raise TransientStoreError("injected: the read failed")
                return actor.backend.load(aggregate_id)
            case Write(plan=plan):
                return self._write(actor, plan)
            case FindPending():
                if self._fault("find_error"):
                    raise TransientStoreError("injected: the query failed")
                return actor.backend.find_pending(
                    after=op.after,
                    limit=op.limit,
                    older_than=op.older_than,
                    partitions=op.partitions,
                )
            case Publish(entry=entry):
                self._publish(entry)
            case Quarantine():
                if self._fault("deadletter_error"):
                    raise TransientStoreError("injected: the dead-letter store failed")
                self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
                self.record.quarantined.setdefault(str(op.entry["id"]), self.record.tick())
                self.stats["quarantined"] += 1
            case ReadChanges(start=start, limit=limit):
                return self._log()[start : start + limit]
            case LogEnd():
                return len(self._log())
            case LoadCheckpoint():
                return self.checkpoint
            case SaveCheckpoint(position=position):
                self._check_checkpoint(position)
                self.checkpoint = position
            case _:
                raise AssertionError(f"unknown operation {op!r}")
        return None

    def _wait(self, actor: Actor, low: int, high: int) -> object:
        actor.wake_at = self.now + self.rng.randint(low, high)
        return _BLOCKED

    def _write(self, actor: Actor, plan: WritePlan) -> bool:
        if self._fault("write_error"):
            raise TransientStoreError("injected: the write failed")
        applied = actor.backend.write(plan)
        kind = type(plan).__name__
        self.stats[f"write.{kind}.{'applied' if applied else 'refused'}"] += 1
        if applied and actor.backend is self.stores.producers:
            if isinstance(plan, CommitPlan):
                self.record.stored.extend(plan.outbox_push)
            elif isinstance(plan, InsertPlan):
                self.record.stored.extend(plan.document.get("outbox") or ())
        if self._fault("write_lost_reply"):
            raise TransientStoreError("injected: the write applied, its reply was lost")
        return applied

    def _publish(self, entry: Any) -> None:
        if self._fault("broker_down"):
            raise BrokerUnavailable("injected: the broker is unreachable")
        if self._fault("poison"):
            raise PermanentPublishError("injected: the broker rejects this message")
        if self._fault("publish_nack"):
            raise PublishError("injected: the broker refused the message")
        self.record.publications.append((self.record.tick(), entry))
        self.published_ids.add(entry.id)
        self._send(DELIVERIES, encode_entry(entry), self.now)
        if self._fault("publish_lost_confirm"):
            raise PublishError("injected: the broker took the message, the confirm was lost")

    def _check_checkpoint(self, position: int) -> None:
        """I5: the checkpoint passes only changes whose entries are published and trimmed."""
        changes = self._log()
        self.stats["checkpoint.saved"] += 1
        pending: dict[Any, set[str]] = {}
        for index in range(self.checkpoint or 0, position):
            doc = changes[index]
            for entry in doc.get("outbox") or ():
                if doc["_id"] not in pending:
                    now = self.stores.producers.load(doc["_id"]) or {}
                    pending[doc["_id"]] = {e["id"] for e in now.get("outbox") or ()}
                entry_id = entry["id"]
                done = entry_id in self.published_ids or entry_id in self.record.quarantined
                if not done or entry_id in pending[doc["_id"]]:
                    self._violation(
                        "checkpoint",
                        f"checkpoint moved to {position} past change {index}, whose entry "
                        f"{doc['_id']} seq {entry['seq']} is not published and trimmed",
                    )


def _kind(op: SimOp) -> str:
    return f"Write.{type(op.plan).__name__}" if isinstance(op, Write) else type(op).__name__


def run_schedule(variant: Variant, *, client: Any = None, trace: bool = False) -> Report:
    """Run one schedule on fresh stores (``client``: a pymongo client, for the wire store)."""
    if variant.store == "wire" and client is None:
        raise ValueError("the wire store needs a pymongo client")
    stores = memory_stores() if variant.store == "memory" else wire_stores(client, variant.seed)
    try:
        with applied(variant.mutation):
            return Simulator(variant, stores, trace=trace).run()
    finally:
        stores.close()


def _describe(item: Any) -> str:
    """A short, ID-free description of an operation or a result, for traces."""
    match item:
        case Write(plan=CommitPlan() as plan):
            seqs = [e["seq"] for e in plan.outbox_push]
            return f"commit {plan.aggregate_id} if v{plan.expected_version}, push seqs {seqs}"
        case Write(plan=InsertPlan() as plan):
            return f"insert {plan.aggregate_id}"
        case Write(plan=TrimPlan() as plan):
            return f"trim {plan.aggregate_id} ({len(plan.entry_ids)} entries)"
        case Load(aggregate_id=aggregate_id):
            return f"load {aggregate_id}"
        case FindPending(after=after, limit=limit):
            return f"find pending after {after} (limit {limit})"
        case Sleep(seconds=seconds):
            return f"sleep {seconds * 1000:.1f} ms"
        case Publish(entry=entry):
            return f"publish {entry.aggregate_id}#{entry.seq} for {entry.destination}"
        case Quarantine(entry=entry):
            return f"quarantine {entry.get('aggregate_id')}#{entry.get('seq')}"
        case Receive(queue=queue):
            return f"receive from {queue}"
        case Ack(queue=queue, tag=tag) | Nack(queue=queue, tag=tag):
            return f"{type(item).__name__.lower()} {queue} tag {tag}"
        case Delivery(body=Command() as command):
            return f"{command.message.id} (tag {item.tag})"
        case Delivery(body=bytes() as body):
            entry = decode_entry(body)
            return f"{entry.aggregate_id}#{entry.seq} for {entry.destination} (tag {item.tag})"
        case dict() if "_id" in item:
            seqs = [e.get("seq") for e in item.get("outbox") or ()]
            return f"{item['_id']} v{item.get('version')} outbox seqs {seqs}"
        case list():
            return f"[{', '.join(_describe(x) for x in item)}]"
    return repr(item)
