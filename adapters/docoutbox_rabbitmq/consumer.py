"""Consume outbox entries from RabbitMQ into an aggregate store, acknowledging after commit."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pika  # type: ignore[import-untyped, unused-ignore]
from pydantic import BaseModel

from docoutbox.errors import StoreError
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
from docoutbox.receive import Action, HandlerRetry, Rejects, Verdict, describe, receive_retrying
from docoutbox.store.api import AggregateStore
from docoutbox_rabbitmq.amqp import masked
from docoutbox_rabbitmq.errors import translated

S = TypeVar("S", bound=BaseModel)
log = logging.getLogger("docoutbox.rabbitmq")


@dataclass
class ConsumerStats:
    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    requeued: int = 0
    rejected: int = 0
    #: Handlings repeated because the handler failed (HandlerRetry).
    retried: int = 0
    #: Rejected deliveries kept in the dead letters.
    dead_lettered: int = 0
    #: Deliveries the broker flagged as redelivered (after a requeue or a lost consumer).
    redelivered: int = 0


class RabbitConsumer(Generic[S]):
    """Feed a queue's deliveries to ``store.handle`` and acknowledge only after the commit.

    Each body is a docoutbox entry (its message carries ``source`` and ``seq``, so exact
    de-duplication works) or a plain ``{id, type, payload}`` message from any producer
    (:func:`docoutbox.codec.decode_message`). It is handled on the aggregate
    ``aggregate_id_of(message)`` and settled as :func:`~docoutbox.receive.receive`
    decides: acked after the commit (or as a duplicate), nacked with requeue after
    ``requeue_delay``, or rejected without requeue.

    A handler that fails is retried first (``retry``: immediately, then after growing
    delays; ``HandlerRetry(immediate=0, delayed=0)`` turns that off). A delivery still
    failing, or invalid, is rejected: with ``dead_letters`` (e.g. ``MongoDeadLetters``)
    it is first stored there with its error, attempts, queue and raw body, beside the
    dispatcher's dead letters, so ``docoutbox dead-letters`` lists and replays both. If
    that store fails, the delivery is requeued rather than lost. Without
    ``dead_letters``, declare the queue with a dead-letter exchange to keep it.

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
        on_verdict: Callable[[Verdict, bool], None] | None = None,
        retry: HandlerRetry | None = None,
        dead_letters: Rejects | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.queue = queue
        self.store = store
        self.handler = handler
        self.aggregate_id_of = aggregate_id_of
        self.create = create
        self.prefetch = prefetch
        self.requeue_delay = requeue_delay
        self.on_verdict = on_verdict
        self.retry = retry if retry is not None else HandlerRetry()
        self.dead_letters = dead_letters
        self._sleep = sleep
        self._rng = random.Random()
        self.stats = ConsumerStats()
        self._url = url
        self._params = pika.URLParameters(url)
        self._params.client_properties = {"connection_name": f"docoutbox-consumer {queue}"}
        self._connection: Any = None

    def __repr__(self) -> str:
        return f"<RabbitConsumer {masked(self._url)} queue={self.queue!r}>"

    def decide(self, body: bytes) -> Verdict:
        """Handle one body against the store and decide how to settle it. No broker I/O."""
        verdict = receive_retrying(
            body,
            self.store,
            self.handler,
            self.aggregate_id_of,
            create=self.create,
            retry=self.retry,
            sleep=self._sleep,
            rng=self._rng,
        )
        self.stats.retried += verdict.attempts - 1
        return verdict

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
                    self._settle(channel, method, verdict, body)
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

    def _settle(self, channel: Any, method: Any, verdict: Verdict, body: bytes) -> None:
        stats, tag, redelivered = self.stats, method.delivery_tag, bool(method.redelivered)
        stats.delivered += 1
        stats.redelivered += redelivered
        if verdict.action is Action.ACK:
            channel.basic_ack(tag)
            if verdict.outcome is not None and verdict.outcome.duplicate:
                stats.duplicates += 1
            else:
                stats.applied += 1
        elif verdict.action is Action.REQUEUE:
            log.warning("requeueing %s", describe(verdict))
            time.sleep(self.requeue_delay)
            channel.basic_nack(tag, requeue=True)
            stats.requeued += 1
        elif not self._keep(verdict, body):
            log.warning("requeueing %s: its dead letter could not be stored", describe(verdict))
            time.sleep(self.requeue_delay)
            channel.basic_nack(tag, requeue=True)
            stats.requeued += 1
        else:
            kept = (
                "in the dead letters"
                if self.dead_letters is not None
                else ("only if the queue has a dead-letter exchange")
            )
            log.error(
                "rejecting %s after %d attempt(s) (kept %s); body %r",
                describe(verdict),
                verdict.attempts,
                kept,
                body[:200],
                exc_info=verdict.error,
            )
            channel.basic_reject(tag, requeue=False)
            stats.rejected += 1
        if self.on_verdict is not None:
            self.on_verdict(verdict, redelivered)

    def _keep(self, verdict: Verdict, body: bytes) -> bool:
        """Store a rejected delivery in the dead letters; False if that failed."""
        if self.dead_letters is None:
            return True
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            data = None
        entry: dict[str, Any] = data if isinstance(data, dict) else {"value": repr(body[:1000])}
        if verdict.message is not None:
            entry.setdefault("id", verdict.message.id)
        aggregate_id = entry.get("aggregate_id")
        try:
            text: str | bytes = body.decode()
        except UnicodeDecodeError:
            text = body
        try:
            self.dead_letters.put(
                aggregate_id if isinstance(aggregate_id, str | int) else None,
                entry,
                describe(verdict),
                verdict.attempts,
                origin="consume",
                queue=self.queue,
                body=text,
            )
        except StoreError as exc:
            log.error("dead_letter_failed queue=%s error=%r", self.queue, exc)
            return False
        self.stats.dead_lettered += 1
        return True
