"""One run of the dispatch flow, driven by hand (a driver without an engine, so a test
sees each operation the flow yields, in order): over a document alone
(:func:`document_run`, every write applied) or over an aggregate of memory ports
(:func:`dispatch_run`, the claim check's tests). :func:`entry` builds a stored entry."""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from datetime import UTC, datetime
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
from docoutbox.stored.values import StoredValues
from docoutbox.testing.memory import MemoryBackend
from docoutbox.testing.payloads import MemoryPayloads
from docoutbox.testing.publisher import MemoryDeadLetters


def accept(entry: OutboxMessage) -> None:
    """A broker that takes every entry."""


def entry(seq: int, **extra: Any) -> dict[str, Any]:
    """A stored entry of aggregate ``a`` (type ``A``), seq ``seq``, ID ``e<seq>``."""
    return {
        "id": f"e{seq}",
        "type": "T",
        "payload": {},
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "seq": seq,
        "aggregate_id": "a",
        "aggregate_type": "A",
        **extra,
    }


def recorded(
    flow: Generator[Any, Any, DispatchResult], perform: Callable[[Any], Any]
) -> tuple[list[Any], DispatchResult]:
    """Drive ``flow`` with ``perform`` (a failure is thrown into the flow, as drivers
    do); the operations it yielded, and its result."""
    ops: list[Any] = []

    def record(op: Any) -> Any:
        ops.append(op)
        return perform(op)

    result: DispatchResult = drive(flow, record)
    return ops, result


def document_run(
    doc: dict[str, Any],
    policy: DispatchPolicy | None = None,
    *,
    values: StoredValues | None = None,
    publish: Callable[[OutboxMessage], None] = accept,
) -> tuple[list[Any], DispatchResult]:
    """One run over ``doc``: ``publish`` is the broker (raising refuses), every write
    applies, anything else (a quarantine, a sleep) returns at once."""

    def perform(op: Any) -> Any:
        if isinstance(op, Publish):
            return publish(op.entry)
        return True if isinstance(op, Write) else None

    flow = dispatch_document(doc, policy or DispatchPolicy(), random.Random(1), values)
    return recorded(flow, perform)


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

    def perform(op: Any) -> Any:
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
    return recorded(flow, perform)
