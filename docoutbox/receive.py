"""How a received entry is settled: ack after commit, requeue, or reject. No broker I/O.

Broker-neutral: any consumer helper can run :func:`receive` and map its :class:`Action`
to its broker's ack, nack-with-requeue and reject-to-dead-letters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel

from docoutbox.codec import decode_entry
from docoutbox.errors import (
    ConcurrencyConflict,
    DocumentTooLarge,
    InboxSaturated,
    InvalidInput,
    NotFound,
    PermanentStoreError,
    TransientStoreError,
)
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
from docoutbox.store.api import AggregateStore
from docoutbox.store.core import Outcome, Status

S = TypeVar("S", bound=BaseModel)


class Action(StrEnum):
    ACK = "ack"  # committed (applied) or already in the inbox (duplicate)
    REQUEUE = "requeue"  # worth another try: nack with requeue
    REJECT = "reject"  # never acceptable: reject without requeue (dead-letter exchange)


@dataclass(frozen=True)
class Verdict:
    """What to do with one delivery, and why."""

    action: Action
    message: Message | None = None
    outcome: Outcome[Any] | None = None
    error: BaseException | None = None
    #: Stop consuming after settling: the store failed in a way retrying will not fix.
    fatal: bool = False


#: Errors that make a delivery unacceptable as it is: requeueing would loop forever.
REJECT_ERRORS: tuple[type[Exception], ...] = (InvalidInput, DocumentTooLarge, NotFound)
#: Errors that may pass when the delivery comes again.
REQUEUE_ERRORS: tuple[type[Exception], ...] = (
    TransientStoreError,
    ConcurrencyConflict,
    InboxSaturated,
)


def receive(
    body: bytes,
    store: AggregateStore[S],
    handler: Handler[S],
    aggregate_id_of: Callable[[Message], AggregateId],
    *,
    create: bool,
) -> Verdict:
    """Decode ``body``, handle its message exactly once on the store, and say how to settle.

    - ``ACK`` once the outcome is ``applied`` or ``duplicate`` (the commit is durable);
    - ``REQUEUE`` on ``gave_up``, a transient store error, a conflict or a saturated
      inbox; also on a permanent store error, marked ``fatal`` so the consumer stops;
    - ``REJECT`` when the body is malformed, the input invalid, the document would grow
      too large, the aggregate is missing (``create=False``) or the handler raised.
    """
    message: Message | None = None
    try:
        message = decode_entry(body).to_message()
        outcome = store.handle(aggregate_id_of(message), message, handler, create=create)
    except REJECT_ERRORS as exc:
        return Verdict(Action.REJECT, message, error=exc)
    except REQUEUE_ERRORS as exc:
        return Verdict(Action.REQUEUE, message, error=exc)
    except PermanentStoreError as exc:
        return Verdict(Action.REQUEUE, message, error=exc, fatal=True)
    except Exception as exc:  # noqa: BLE001 - a handler bug: dead-letter it, do not loop
        return Verdict(Action.REJECT, message, error=exc)
    if outcome.status is Status.GAVE_UP:
        return Verdict(Action.REQUEUE, message, outcome)
    return Verdict(Action.ACK, message, outcome)


def describe(verdict: Verdict) -> str:
    """Which message, and why it was not acked (for logs)."""
    name = f"message {verdict.message.id}" if verdict.message is not None else "a delivery"
    if verdict.error is not None:
        return f"{name}: {type(verdict.error).__name__}: {verdict.error}"
    assert verdict.outcome is not None
    return f"{name}: gave up after {verdict.outcome.attempts} attempts"
