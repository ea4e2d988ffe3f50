"""Trace lines: short, ID-free descriptions of operations and their results."""

from __future__ import annotations

from typing import Any

from docoutbox.codec import decode_entry
from docoutbox.dispatch.engine.flow import Publish, Quarantine
from docoutbox.store.core import FindPending, Load, Sleep, Write
from docoutbox.store.plans import CommitPlan, FailurePlan, InsertPlan, TrimPlan
from tests.simulation.actors import Ack, Command, Nack, Receive
from tests.simulation.queues import Delivery


def describe(item: Any) -> str:
    """A short, ID-free description of an operation or a result, for traces."""
    match item:
        case Write(plan=CommitPlan() as plan):
            seqs = [e.get("seq") for e in plan.outbox_push]
            return f"commit {plan.aggregate_id} if v{plan.expected_version}, push seqs {seqs}"
        case Write(plan=InsertPlan() as plan):
            return f"insert {plan.aggregate_id}"
        case Write(plan=TrimPlan() as plan):
            return f"trim {plan.aggregate_id} ({len(plan.entry_ids)} entries)"
        case Write(plan=FailurePlan() as plan):
            return f"record failure {plan.aggregate_id} attempt {plan.attempts}"
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
            return f"[{', '.join(describe(x) for x in item)}]"
    return repr(item)
