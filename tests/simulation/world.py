"""Everything outside the processes: stores, queues, broker, dead letters, checkpoint.

:meth:`World.perform` carries out one operation for a process and decides, from the
schedule's fault rates, whether it fails before it happens or happens and then fails (a
write whose reply is lost, a publish whose confirm is lost). Whatever happens is written
to the :class:`~tests.simulation.invariants.Record` that the invariants check.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox.codec import encode_entry
from docoutbox.dispatch.engine.flow import Publish, Quarantine
from docoutbox.dispatch.engine.loop import (
    CloseStream,
    FindDue,
    LoadCheckpoint,
    OpenStream,
    PollChanges,
    SaveCheckpoint,
    StartMarker,
)
from docoutbox.errors import (
    BrokerUnavailable,
    ChangeStreamLost,
    PermanentPublishError,
    PublishError,
    TransientStoreError,
)
from docoutbox.model import Message, OutboxMessage
from docoutbox.ports.archive import InboxArchive
from docoutbox.ports.dispatch import ChangeEvent
from docoutbox.ports.store import DueBackend, StoreBackend
from docoutbox.store.core import FindPending, Load, Write
from docoutbox.store.document import Document
from docoutbox.store.plans import CommitPlan, InsertPlan, ReleasePlan, TrimPlan, WritePlan
from docoutbox.store.spill import Archive, Archived
from docoutbox.stored.claim import (
    DeletePayloads,
    DeleteStale,
    FindStale,
    GetPayload,
    PutPayload,
)
from docoutbox.stored.sweep import DeadLettered
from docoutbox.testing import MemoryBackend, MemoryDeadLetters
from tests.simulation.actors import (
    COMMANDS,
    DELIVERIES,
    Ack,
    Command,
    HandlerFault,
    Nack,
    Poll,
    Receive,
    SimOp,
)
from tests.simulation.claims import Claims
from tests.simulation.invariants import Record, Violation
from tests.simulation.queues import Queue
from tests.simulation.schedule import Schedule
from tests.simulation.stores import Stores

#: The simulated clock's zero: step ``n`` is ``n`` milliseconds after it.
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)

#: What :meth:`World.perform` returns when the operation must wait (nothing to receive).
BLOCKED = object()


class World:
    def __init__(self, schedule: Schedule, stores: Stores, stats: Counter[str]) -> None:
        self.schedule = s = schedule
        self.stores = stores
        self.stats = stats
        self.fault_rng = random.Random(f"{s.seed}/faults")
        self.faulty = True
        self.now = 0
        self.record = Record()
        self.dead_letters = MemoryDeadLetters()
        self.published_ids: set[str] = set()
        #: Entry ID -> due time, of every scheduled entry stored.
        self.dues: dict[str, datetime] = {}
        self.checkpoint: int | None = None
        #: The dispatcher's open change stream: the log position it reads next.
        self.cursor: int | None = None
        self.queues: dict[str, Queue[Any]] = {
            name: Queue(name, random.Random(f"{s.seed}/{name}"), reorder=s.reorder)
            for name in (COMMANDS, DELIVERIES)
        }
        self.producer_ids = [f"p{i}" for i in range(1, s.producers + 1)]
        self.sink_ids = [f"c{i}" for i in range(1, s.consumers + 1)]
        #: The claim check's payload store, and its checks.
        self.claims = Claims(
            self.fault,
            self.violation,
            stats,
            lambda agg: self.stores.producers.load(agg),
            self.dead_letters.refers_to,
        )
        self.payloads = self.claims.payloads
        #: Whether the dispatcher holds a deferred trim of an aggregate (set by the harness).
        self.trim_deferred: Callable[[Any], bool] = lambda aggregate_id: False

    def fault(self, kind: str) -> bool:
        p = self.schedule.fault(kind) if self.faulty else 0.0
        if p and self.fault_rng.random() < p:
            self.stats[f"fault.{kind}"] += 1
            return True
        return False

    def violation(self, invariant: str, detail: str) -> None:
        self.record.violations.append(Violation(invariant, detail))

    def issue_commands(self) -> None:
        """The clients' commands, each visible at a random step of the faulty phase."""
        s = self.schedule
        rng = random.Random(f"{s.seed}/clients")
        timing = random.Random(f"{s.seed}/scheduled")  # drawn apart: seeds keep their commands
        for pid in self.producer_ids:
            for j in range(1, s.commands + 1):
                count = rng.randint(0, s.max_targets)
                targets = tuple(rng.choice(self.sink_ids) for _ in range(count))
                payload: dict[str, Any] = {"targets": list(targets)}
                scheduled = timing.randrange(100) < s.scheduled
                if scheduled:
                    payload.update(after=timing.randint(0, 200), key=f"{pid}-{j}")
                message = Message(
                    id=f"cmd-{pid}-{j}",
                    type="Work",
                    payload=payload,
                    source=f"client/{pid}",
                    seq=j,
                )
                command = Command(pid, message, targets)
                self.record.commands.append(command)
                visible = rng.randint(0, s.fault_steps * 2 // 3)
                self.send(COMMANDS, command, visible)
                if scheduled and targets and timing.randrange(100) < s.cancels:
                    self.issue_cancel(pid, j, len(targets), visible + timing.randint(0, 150))

    def issue_cancel(self, pid: str, j: int, count: int, visible_at: int) -> None:
        """A command cancelling the scheduled effects of command ``j`` of ``pid``."""
        message = Message(
            id=f"cancel-{pid}-{j}",
            type="Cancel",
            payload={"keys": [f"{pid}-{j}/{k}" for k in range(count)]},
            source=f"client/{pid}/cancel",
            seq=j,
        )
        command = Command(pid, message, ())
        self.record.commands.append(command)
        self.send(COMMANDS, command, visible_at)

    def send(self, queue: str, body: Any, visible_at: int) -> None:
        if self.fault("delay"):
            visible_at += self.fault_rng.randint(1, 40)
        self.queues[queue].put(body, visible_at)
        if self.fault("duplicate"):
            self.queues[queue].put(body, visible_at + self.fault_rng.randint(0, 30))

    def quiescent(self) -> bool:
        if not all(q.idle() for q in self.queues.values()):
            return False
        if self.schedule.dispatcher == "log" and self.checkpoint != len(self.log()):
            return False
        return not self.stores.producers.find_pending(after=None, limit=1)

    def busy(self) -> str:
        queues = {name: q.counts() for name, q in self.queues.items()}
        pending = [d["_id"] for d in self.stores.producers.find_pending(after=None, limit=10)]
        text = f"(waiting, in flight) {queues}, pending {pending}"
        if self.schedule.dispatcher == "log":
            text += f", checkpoint {self.checkpoint} of {len(self.log())} changes"
        return text

    def log(self) -> list[Document]:
        assert self.stores.changes is not None, "this store keeps no change log"
        return self.stores.changes

    def perform(self, owner: str, backend: StoreBackend, op: SimOp) -> Any:
        """Carry out ``op`` for the process ``owner``; raise the error a fault causes."""
        match op:
            case Receive(queue=name):
                delivery = self.queues[name].take(self.now, owner)
                if delivery is None:
                    return BLOCKED
                self.stats[f"{name}.redelivered"] += delivery.redelivered
                return delivery
            case Poll(queue=name):
                polled = self.queues[name].take(self.now, owner)
                if polled is not None:
                    self.stats[f"{name}.redelivered"] += polled.redelivered
                return polled
            case HandlerFault():
                return self.fault("handler_error")
            case Ack(queue=name, tag=tag):
                self.queues[name].ack(tag)
            case Nack(queue=name, tag=tag):
                self.queues[name].nack(tag, self.now)
            case Load(aggregate_id=aggregate_id):
                if self.fault("load_error"):
                    raise TransientStoreError("injected: the read failed")
                return backend.load(aggregate_id)
            case Write(plan=plan):
                return self.write(backend, plan)
            case Archive(aggregate_id=aggregate_id, ids=ids):
                if self.fault("write_error"):
                    raise TransientStoreError("injected: the archive write failed")
                assert isinstance(backend, InboxArchive)
                self.stats["archive.written"] += 1
                return backend.archive_inbox(aggregate_id, ids)
            case Archived(aggregate_id=aggregate_id, ids=ids, token=token):
                if self.fault("load_error"):
                    raise TransientStoreError("injected: the archive read failed")
                assert isinstance(backend, InboxArchive)
                self.stats["archive.read"] += 1
                return backend.archived_inbox(aggregate_id, ids, token)
            case FindPending(after=after, limit=limit, older_than=older, partitions=parts):
                if self.fault("find_error"):
                    raise TransientStoreError("injected: the query failed")
                return backend.find_pending(
                    after=after, limit=limit, older_than=older, partitions=parts
                )
            case FindDue(due_before=before, after=after, limit=limit, partitions=parts):
                if self.fault("find_error"):
                    raise TransientStoreError("injected: the due query failed")
                assert isinstance(backend, DueBackend)
                found: list[Document] = backend.find_due(
                    due_before=before, after=after, limit=limit, partitions=parts
                )
                return found
            case PutPayload() | GetPayload() | DeletePayloads() | FindStale() | DeleteStale():
                return self.claims.perform(op, owner)
            case DeadLettered(payload_id=payload_id):
                if self.fault("find_error"):
                    raise TransientStoreError("injected: the dead-letter query failed")
                return self.dead_letters.refers_to(payload_id)
            case Publish(entry=entry):
                self.publish(entry)
            case Quarantine():
                if self.fault("deadletter_error"):
                    raise TransientStoreError("injected: the dead-letter store failed")
                self.check_attempts(op)
                self.claims.check_quarantined(op.entry, owner)
                self.dead_letters.put(op.aggregate_id, op.entry, op.error, op.attempts)
                self.record.quarantined.setdefault(str(op.entry["id"]), self.record.tick())
                self.stats["quarantined"] += 1
            case StartMarker():
                self.stats["dispatcher.fresh_start"] += 1
                return len(self.log())
            case OpenStream(position=position):
                if not isinstance(position, int) or not 0 <= position <= len(self.log()):
                    raise ChangeStreamLost(f"position {position!r} is not in the change log")
                self.cursor = position
            case PollChanges(max_events=limit):
                if self.cursor is None:
                    raise ChangeStreamLost("the change stream is not open")
                start = self.cursor
                docs = self.log()[start : start + limit]
                self.cursor = start + len(docs)
                return [ChangeEvent(start + i + 1, doc) for i, doc in enumerate(docs)]
            case CloseStream():
                self.cursor = None
            case LoadCheckpoint():
                if self.checkpoint is None and self.schedule.recovery == "replay":
                    self.stats["dispatcher.replay"] += 1
                    return 0  # a checkpoint store that starts at the log's beginning
                return self.checkpoint
            case SaveCheckpoint(position=position):
                self.check_checkpoint(position)
                self.checkpoint = position
            case _:
                raise AssertionError(f"unknown operation {op!r}")
        return None

    def write(self, backend: StoreBackend, plan: WritePlan) -> bool:
        if self.fault("write_error"):
            raise TransientStoreError("injected: the write failed")
        before = self.peek(backend, plan)
        applied = backend.write(plan)
        if applied and before is not None:
            self.check_write(backend, plan, before)
        self.stats[f"write.{type(plan).__name__}.{'applied' if applied else 'refused'}"] += 1
        if applied and backend is self.stores.producers:
            if isinstance(plan, CommitPlan):
                self.claims.committed(plan.outbox_push)
            if isinstance(plan, ReleasePlan):
                self.record.numbered.setdefault(plan.entry_id, []).append(plan.outbox_seq + 1)
            if isinstance(plan, CommitPlan):
                self.record.stored.extend(plan.outbox_push)
                self.record.number(plan.outbox_push)
                self.dues.update(
                    (e["id"], e["due"]) for e in plan.outbox_push if e.get("due") is not None
                )
                self.stats["scheduled.stored"] += sum("due" in e for e in plan.outbox_push)
                self.stats["scheduled.cancelled"] += len(plan.cancel_ids)
                if plan.cancel_ids:
                    tick = self.record.tick()
                    for entry_id in plan.cancel_ids:
                        self.record.cancelled.setdefault(entry_id, tick)
                if self.trim_deferred(plan.aggregate_id):  # a business write wins the race
                    self.stats["write.CommitPlan.before_deferred_trim"] += 1
            elif isinstance(plan, InsertPlan):
                self.claims.committed(plan.document.get("outbox") or ())
                self.record.stored.extend(plan.document.get("outbox") or ())
                self.record.number(plan.document.get("outbox") or ())
        if self.fault("write_lost_reply"):
            raise TransientStoreError("injected: the write applied, its reply was lost")
        return applied

    def peek(self, backend: StoreBackend, plan: WritePlan) -> Document | None:
        """The stored document a checked write applies to, read without a copy (memory
        store only; the write replaces it rather than changing it in place)."""
        docs = backend.docs if isinstance(backend, MemoryBackend) else None
        if docs is None or isinstance(plan, InsertPlan):
            return None
        if isinstance(plan, CommitPlan) and not plan.inbox_push:
            return None
        return docs.get(plan.aggregate_id)

    def check_write(self, backend: StoreBackend, plan: WritePlan, before: Document) -> None:
        """A trim or a failure record leaves ``version`` alone (so it never fails a commit);
        a trim removes every entry it names; a commit's message is in the inbox window. A
        release changes ``version`` on purpose (so a commit read before it fails)."""
        assert isinstance(backend, MemoryBackend)
        after = backend.docs.get(plan.aggregate_id) or {}
        where = f"{plan.aggregate_id}: {type(plan).__name__}"
        if isinstance(plan, CommitPlan):
            inbox = list(after.get("inbox") or ())
            if any(message_id not in inbox for message_id in plan.inbox_push):
                self.violation(
                    "inbox-window", f"{where} pushed {plan.inbox_push}, the inbox is {inbox}"
                )
            if backend is self.stores.sinks and self.schedule.consumer_spill:
                # Rule 1 of docoutbox.store.spill: an ID leaves the inbox only once archived.
                gone = set(before.get("inbox") or ()) - set(inbox)
                lost = gone - backend.archive.get(plan.aggregate_id, set())
                if lost:
                    self.violation("inbox-spill", f"{where} dropped {sorted(lost)} unarchived")
            return
        if isinstance(plan, ReleasePlan):
            return
        if after.get("version") != before.get("version"):
            self.violation(
                "trim-version",
                f"{where} changed version {before.get('version')} to {after.get('version')}",
            )
        if isinstance(plan, TrimPlan):
            left = [e["id"] for e in after.get("outbox") or () if e["id"] in plan.entry_ids]
            if left:
                self.violation("trimmed", f"{where} of {plan.entry_ids} left {left}")

    def check_attempts(self, op: Quarantine) -> None:
        """An entry is quarantined after exactly ``max_attempts`` failed publishes, unless
        the broker rejected it for good."""
        limit = self.schedule.publish_attempts
        permanent = op.error.startswith(PermanentPublishError.__name__)
        if not permanent and op.attempts != limit:
            self.violation(
                "attempts",
                f"{op.entry.get('id')} quarantined after {op.attempts} attempts, not {limit}",
            )

    def stuck(self, entry: OutboxMessage) -> bool:
        percent = self.schedule.stuck if self.faulty else 0
        return (
            bool(percent)
            and random.Random(f"stuck/{entry.aggregate_id}/{entry.seq}").randrange(100) < percent
        )

    def publish(self, entry: OutboxMessage) -> None:
        if self.stuck(entry):
            self.stats["fault.stuck"] += 1
            raise PublishError("injected: the broker refuses this message while faults last")
        if self.fault("broker_down"):
            raise BrokerUnavailable("injected: the broker is unreachable")
        if self.fault("poison"):
            raise PermanentPublishError("injected: the broker rejects this message")
        if self.fault("publish_nack"):
            raise PublishError("injected: the broker refused the message")
        self.check_scheduled(entry)
        self.claims.check_published(entry)
        self.record.publications.append((self.record.tick(), entry))
        self.published_ids.add(entry.id)
        self.send(DELIVERIES, encode_entry(entry), self.now)
        if self.fault("publish_lost_confirm"):
            raise PublishError("injected: the broker took the message, the confirm was lost")

    def clock(self) -> datetime:
        return EPOCH + timedelta(milliseconds=self.now)

    def check_scheduled(self, entry: OutboxMessage) -> None:
        """A scheduled entry is never published before it is due, and no entry once its
        cancellation committed."""
        due = self.dues.get(entry.id)
        if due is not None and self.clock() < due:
            self.violation(
                "scheduled-early", f"{entry.id} published at {self.clock()}, due at {due}"
            )
        if entry.id in self.record.cancelled:
            self.violation(
                "cancelled",
                f"{entry.id} published after its cancellation committed "
                f"(event {self.record.cancelled[entry.id]})",
            )

    def check_checkpoint(self, position: int) -> None:
        """I5: the checkpoint passes only changes whose entries are published and trimmed.

        Scheduled entries are the exception: a change is passed once its run left them for
        later (the due query finds them; ``published`` checks they were), or cancelled."""
        self.stats["checkpoint.saved"] += 1
        pending: dict[Any, set[str]] = {}
        for index in range(self.checkpoint or 0, position):
            doc = self.log()[index]
            for entry in doc.get("outbox") or ():
                if entry.get("due") is not None or entry["id"] in self.record.cancelled:
                    continue
                if doc["_id"] not in pending:
                    current = self.stores.producers.load(doc["_id"]) or {}
                    pending[doc["_id"]] = {e["id"] for e in current.get("outbox") or ()}
                entry_id = entry["id"]
                done = entry_id in self.published_ids or entry_id in self.record.quarantined
                if not done or entry_id in pending[doc["_id"]]:
                    self.violation(
                        "checkpoint",
                        f"checkpoint moved to {position} past change {index}, whose entry "
                        f"{doc['_id']} seq {entry.get('seq')} is not published and trimmed",
                    )
