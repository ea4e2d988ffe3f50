"""How a received entry is settled: ack after commit, requeue, or reject. No broker I/O.

Broker-neutral: any consumer helper can run :func:`receive` and map its :class:`Action`
to its broker's ack, nack-with-requeue and reject-to-dead-letters.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from docoutbox.codec import decode_message
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
from docoutbox.retry import backoff
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
    #: How many times the delivery was handled before this verdict (handler retries).
    attempts: int = 1


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

    ``body`` is a docoutbox entry or a plain ``{id, type, payload}`` message
    (:func:`~docoutbox.codec.decode_message`).

    - ``ACK`` once the outcome is ``applied`` or ``duplicate`` (the commit is durable);
    - ``REQUEUE`` on ``gave_up``, a transient store error, a conflict or a saturated
      inbox; also on a permanent store error, marked ``fatal`` so the consumer stops;
    - ``REJECT`` when the body is malformed, the input invalid, the document would grow
      too large, the aggregate is missing (``create=False``) or the handler raised.
    """
    message: Message | None = None
    try:
        message = decode_message(body)
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


#: Rejections that no retry can fix: the delivery itself is wrong.
FINAL_ERRORS: tuple[type[Exception], ...] = (InvalidInput, DocumentTooLarge)


@dataclass(frozen=True)
class HandlerRetry:
    """Retries of a delivery whose handling failed, before it is rejected: ``immediate``
    attempts at once, then ``delayed`` attempts after exponential backoff with jitter
    (:func:`docoutbox.retry.backoff`). Invalid input is never retried."""

    immediate: int = 2
    delayed: int = 3
    base_delay: float = 0.2
    max_delay: float = 5.0

    def delays(self, rng: random.Random) -> list[float]:
        later = [
            backoff(n, self.base_delay, self.max_delay, rng, floor=0.5)
            for n in range(1, self.delayed + 1)
        ]
        return [0.0] * self.immediate + later


def retryable(verdict: Verdict) -> bool:
    return verdict.action is Action.REJECT and not isinstance(verdict.error, FINAL_ERRORS)


def receive_retrying(
    body: bytes,
    store: AggregateStore[S],
    handler: Handler[S],
    aggregate_id_of: Callable[[Message], AggregateId],
    *,
    create: bool,
    retry: HandlerRetry,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> Verdict:
    """:func:`receive`, retried as ``retry`` says while the verdict is a retryable reject.

    Each attempt is a fresh exactly-once handling: a retry after a commit that did happen
    is a duplicate, acked. The verdict's ``attempts`` says how many handlings it took.
    """
    rng = rng or random.Random()
    verdict = receive(body, store, handler, aggregate_id_of, create=create)
    attempts = 1
    for delay in retry.delays(rng):
        if not retryable(verdict):
            break
        if delay > 0:
            sleep(delay)
        verdict = receive(body, store, handler, aggregate_id_of, create=create)
        attempts += 1
    return replace(verdict, attempts=attempts)


class Rejects(Protocol):
    """Where a consumer keeps the deliveries it rejects (e.g. ``MongoDeadLetters``)."""

    def put(
        self,
        aggregate_id: AggregateId | None,
        entry: dict[str, Any],
        error: str,
        attempts: int,
        *,
        origin: str = ...,
        queue: str | None = ...,
        body: str | bytes | None = ...,
    ) -> None: ...
