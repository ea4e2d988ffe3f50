"""Consume outbox entries from RabbitMQ into an aggregate store, acknowledging after commit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

import pika  # type: ignore[import-untyped, unused-ignore]
from pydantic import BaseModel

from docoutbox.aggregate import Handler
from docoutbox.dispatch import decode_entry
from docoutbox.errors import (
    ConcurrencyConflict,
    DocumentTooLarge,
    InboxSaturated,
    InvalidInput,
    NotFound,
    PermanentStoreError,
    TransientStoreError,
)
from docoutbox.flows import Outcome, Status
from docoutbox.model import AggregateId, Message
from docoutbox.store import AggregateStore
from docoutbox_rabbitmq.errors import translated
from docoutbox_rabbitmq.publisher import masked

S = TypeVar("S", bound=BaseModel)
log = logging.getLogger("docoutbox.rabbitmq")


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


@dataclass
class ConsumerStats:
    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    requeued: int = 0
    rejected: int = 0
    #: Deliveries the broker flagged as redelivered (after a requeue or a lost consumer).
    redelivered: int = 0


class RabbitConsumer(Generic[S]):
    """Feed a queue's deliveries to ``store.handle`` and acknowledge only after the commit.

    Each body is decoded with :func:`docoutbox.dispatch.decode_entry`; the entry's message
    (with ``source`` and ``seq``, so exact de-duplication works) is handled on the
    aggregate ``aggregate_id_of(message)``. A delivery is

    - acked once the outcome is ``applied`` or ``duplicate``;
    - nacked with requeue (after ``requeue_delay``) on ``gave_up``, a transient store
      error, a conflict or a saturated inbox;
    - rejected without requeue, and logged, when the body is malformed, the input invalid,
      the document would grow too large, the aggregate is missing (``create=False``) or
      the handler raised: declare the queue with a dead-letter exchange to keep these;
    - nacked with requeue on a permanent store error, and :meth:`run` raises it.

    A requeued delivery may be overtaken by later ones when ``prefetch`` > 1; use
    ``prefetch=1`` where a source's order must hold across requeues. Like any pika
    connection, a consumer belongs to one thread; run several for parallelism.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        store: AggregateStore[S],
        handler: Handler[S],
        *,
        aggregate_id_of: Callable[[Message], AggregateId],
        create: bool = False,
        prefetch: int = 16,
        requeue_delay: float = 0.05,
        on_verdict: Callable[[Verdict], None] | None = None,
    ) -> None:
        self.queue = queue
        self.store = store
        self.handler = handler
        self.aggregate_id_of = aggregate_id_of
        self.create = create
        self.prefetch = prefetch
        self.requeue_delay = requeue_delay
        self.on_verdict = on_verdict
        self.stats = ConsumerStats()
        self._url = url
        self._params = pika.URLParameters(url)
        self._params.client_properties = {"connection_name": f"docoutbox-consumer {queue}"}
        self._connection: Any = None

    def __repr__(self) -> str:
        return f"<RabbitConsumer {masked(self._url)} queue={self.queue!r}>"

    def decide(self, body: bytes) -> Verdict:
        """Handle one body against the store and decide how to settle it. No broker I/O."""
        message: Message | None = None
        try:
            message = decode_entry(body).to_message()
            outcome = self.store.handle(
                self.aggregate_id_of(message), message, self.handler, create=self.create
            )
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

    def run(
        self,
        *,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
        poll: float = 0.1,
    ) -> ConsumerStats:
        """Consume until ``max_messages`` deliveries, ``idle_timeout`` seconds without one,
        or ``stop`` is set. Raises ``BrokerUnavailable`` if the connection fails (unacked
        deliveries come again), and a permanent store error after requeueing its delivery.
        """
        where = f"consume {self.queue!r} from {masked(self._url)}"
        count = 0
        with translated(where):
            if self._connection is None or self._connection.is_closed:
                self._connection = pika.BlockingConnection(self._params)
            channel = self._connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            idle_since = time.monotonic()
            try:
                for method, _props, body in channel.consume(self.queue, inactivity_timeout=poll):
                    if method is None:
                        if stop is not None and stop.is_set():
                            break
                        if idle_timeout is not None and (
                            time.monotonic() - idle_since >= idle_timeout
                        ):
                            break
                        continue
                    verdict = self.decide(body)
                    self.stats.redelivered += bool(method.redelivered)
                    self._settle(channel, method.delivery_tag, verdict, body)
                    if verdict.fatal and verdict.error is not None:
                        raise verdict.error
                    count += 1
                    idle_since = time.monotonic()
                    if (max_messages is not None and count >= max_messages) or (
                        stop is not None and stop.is_set()
                    ):
                        break
            finally:
                if channel.is_open:
                    channel.cancel()  # unacked prefetched deliveries go back to the queue
                    channel.close()
        return self.stats

    def close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            with translated(f"close {masked(self._url)}"):
                self._connection.close()
        self._connection = None

    def _settle(self, channel: Any, tag: int, verdict: Verdict, body: bytes) -> None:
        stats = self.stats
        stats.delivered += 1
        if verdict.action is Action.ACK:
            channel.basic_ack(tag)
            if verdict.outcome is not None and verdict.outcome.duplicate:
                stats.duplicates += 1
            else:
                stats.applied += 1
        elif verdict.action is Action.REQUEUE:
            log.warning("requeueing %s: %s", _name(verdict), _why(verdict))
            time.sleep(self.requeue_delay)
            channel.basic_nack(tag, requeue=True)
            stats.requeued += 1
        else:
            log.error(
                "rejecting %s (dead-lettered if the queue has a dead-letter exchange): %s; "
                "body starts %r",
                _name(verdict),
                _why(verdict),
                body[:200],
                exc_info=verdict.error,
            )
            channel.basic_reject(tag, requeue=False)
            stats.rejected += 1
        if self.on_verdict is not None:
            self.on_verdict(verdict)


def _name(verdict: Verdict) -> str:
    return f"message {verdict.message.id}" if verdict.message is not None else "a delivery"


def _why(verdict: Verdict) -> str:
    if verdict.error is not None:
        return f"{type(verdict.error).__name__}: {verdict.error}"
    assert verdict.outcome is not None
    return f"gave up after {verdict.outcome.attempts} attempts"
