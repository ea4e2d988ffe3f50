"""One run of the dispatch flow over one aggregate, every operation performed on memory
ports: the hand-driven run the claim check's unit tests share (a driver without an
engine, so a test sees each operation the flow yields, in order)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import Any

from docoutbox.dispatch.engine.flow import (
    DispatchPolicy,
    DispatchResult,
    Publish,
    Quarantine,
    dispatch_document,
)
from docoutbox.drive import drive
from docoutbox.model import OutboxMessage
from docoutbox.store.core import Sleep, Write
from docoutbox.stored.claim import DeletePayloads, GetPayload, perform_payload
from docoutbox.stored.sweep import DeadLettered
from docoutbox.testing.memory import MemoryBackend
from docoutbox.testing.payloads import MemoryPayloads
from docoutbox.testing.publisher import MemoryDeadLetters


def accept(entry: OutboxMessage) -> None:
    """A broker that takes every entry."""


def dispatch_run(
    backend: MemoryBackend,
    payloads: MemoryPayloads,
    now: datetime,
    *,
    publish: Callable[[OutboxMessage], None] = accept,
    dead: MemoryDeadLetters | None = None,
    refers_to: Callable[[str], bool] | None = None,
    policy: DispatchPolicy | None = None,
    references: bool = False,
    aggregate_id: str = "a",
) -> tuple[list[Any], DispatchResult]:
    """The operations one run over ``aggregate_id`` yielded, and its result.

    ``publish`` is the broker (raising refuses); a quarantine goes to ``dead`` (dropped
    without one); the dead letters' answer about a payload is ``refers_to``, else
    ``dead``'s, else no. A failing operation is thrown into the flow, as drivers do;
    a backoff's sleep returns at once."""
    doc = backend.load(aggregate_id)
    assert doc is not None
    asked = refers_to or (dead.refers_to if dead is not None else lambda _: False)
    ops: list[Any] = []

    def perform(op: Any) -> Any:
        ops.append(op)
        if isinstance(op, Publish):
            return publish(op.entry)
        if isinstance(op, Quarantine):
            if dead is not None:
                dead.put(op.aggregate_id, op.entry, op.error, op.attempts)
            return None
        if isinstance(op, Write):
            return backend.write(op.plan)
        if isinstance(op, GetPayload | DeletePayloads):
            return perform_payload(op, payloads)
        if isinstance(op, DeadLettered):
            return asked(op.payload_id)
        assert isinstance(op, Sleep), op
        return None

    flow = dispatch_document(
        doc, policy or DispatchPolicy(), random.Random(1), None, now, references=references
    )
    result: DispatchResult = drive(flow, perform)
    return ops, result
