"""Consume outbox entries from RabbitMQ into an aggregate store, acknowledging after commit.

The pika shell (:class:`RabbitConsumer`) and the aio-pika one
(:class:`~docoutbox_rabbitmq.aio.AsyncRabbitConsumer`) share :class:`Settlement`: their
settings, counts and logs. What to do with a delivery is decided by
:mod:`docoutbox.receive`; only the ack, nack or reject is the shell's.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import pika  # type: ignore[import-untyped, unused-ignore]
from pydantic import BaseModel

from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
from docoutbox.receive import (
    Action,
    ConsumerStats,
    Delivery,
    HandlerRetry,
    KeptReceiver,
    Options,
    Receiver,
    Rejects,
    Verdict,
    creating_types,
    keep_sync,
    log_verdict,
)
from docoutbox.store.api import AggregateStore
from docoutbox_rabbitmq.amqp import check_url, masked, pika_parameters
from docoutbox_rabbitmq.errors import translated

S = TypeVar("S", bound=BaseModel)
St = TypeVar("St")
R = TypeVar("R")
log = logging.getLogger("docoutbox.rabbitmq")

__all__ = ["ConsumerStats", "RabbitConsumer", "Settlement"]


#: The settings a consumer's receiver is built from: setting one drops the receiver, and
#: the next delivery builds it again.
RECEIVER_SETTINGS = frozenset(
    {"store", "handler", "aggregate_id_of", "create", "creates", "retry", "dead_letters"}
)


class Settlement(KeptReceiver, Generic[St, R]):
    """What the pika and aio-pika consumers share: settings, counts, logs (no I/O).

    What handles a delivery (the receive flow's options and its receiver) is built on the
    first delivery and kept for the next ones, not built again for each: setting one of
    :data:`RECEIVER_SETTINGS` drops it.
    """

    receiver_settings = RECEIVER_SETTINGS

    def __init__(
        self,
        url: str,
        queue: str,
        store: St,
        handler: Handler[Any],
        *,
        aggregate_id_of: Callable[[Message], AggregateId],
        create: bool = False,
        creates: Iterable[str] = (),
        prefetch: int = 16,
        requeue_delay: float = 0.05,
        on_verdict: Callable[[Verdict, bool], None] | None = None,
        retry: HandlerRetry | None = None,
        dead_letters: R | None = None,
    ) -> None:
        self.queue = queue
        self.store = store
        self.handler = handler
        self.aggregate_id_of = aggregate_id_of
        self.create = create
        self.creates = creating_types(creates)
        self.prefetch = prefetch
        self.requeue_delay = requeue_delay
        self.on_verdict = on_verdict
        self.retry = retry if retry is not None else HandlerRetry()
        self.dead_letters = dead_letters
        self.stats = ConsumerStats()
        self._rng = random.Random()
        self._url = check_url(url)
        self._connection_name = f"docoutbox-consumer {queue}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {masked(self._url)} queue={self.queue!r}>"

    def _where(self) -> str:
        return f"consume {self.queue!r} from {masked(self._url)}"

    def _options(self) -> Options:
        return Options(
            self.create, self.retry, keep=self.dead_letters is not None, creates=self.creates
        )

    def _account(self, verdict: Verdict, redelivered: bool, body: bytes) -> None:
        """Count and log a delivery about to be settled as ``verdict`` says (an acked
        one is only counted)."""
        self.stats.count(verdict, redelivered)
        if verdict.action is not Action.ACK:
            kept = (
                "in the dead letters"
                if self.dead_letters is not None
                else "only if the queue has a dead-letter exchange"
            )
            log_verdict(log, verdict, body, kept)
        if self.on_verdict is not None:
            self.on_verdict(verdict, redelivered)

    @staticmethod
    def _done(count: int, max_messages: int | None, stop: Any) -> bool:
        return (max_messages is not None and count >= max_messages) or (
            stop is not None and stop.is_set()
        )

    @staticmethod
    def _idle(idle_for: float, idle_timeout: float | None, stop: Any) -> bool:
        return (stop is not None and stop.is_set()) or (
            idle_timeout is not None and idle_for >= idle_timeout
        )


class RabbitConsumer(Settlement[AggregateStore[S], Rejects], Generic[S]):
    """Feed a queue's deliveries to ``store.handle`` and acknowledge only after the commit.

    Each body is a docoutbox entry (its message carries ``source`` and ``seq``, so exact
    de-duplication works) or a plain ``{id, type, payload}`` message from any producer
    (:func:`docoutbox.codec.decode_message`). It is handled on the aggregate
    ``aggregate_id_of(message)`` and settled as :mod:`docoutbox.receive` decides:
    acked after the commit (or as a duplicate), nacked with requeue after
    ``requeue_delay``, or rejected without requeue.

    A message to an aggregate that does not exist yet creates it when its type is in
    ``creates`` (e.g. ``creates={"PlaceOrder"}``), or any type with ``create=True``;
    otherwise it is NotFound: retried, then rejected.

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
        sleep: Callable[[float], None] = time.sleep,
        **options: Any,
    ) -> None:
        super().__init__(url, queue, store, handler, **options)
        self._sleep = sleep
        self._params = pika_parameters(url)
        self._params.client_properties = {"connection_name": self._connection_name}
        self._connection: Any = None

    def decide(
        self,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> Verdict:
        """Handle one delivery against the store and decide how to settle it, keeping it
        in the dead letters if rejected. No broker I/O.

        The body may also be a CloudEvent, structured or binary (attributes in ``headers``)."""
        receiver: Receiver[S] | None = self._receiver
        if receiver is None:
            receiver = self._receiver = Receiver(
                self.store,
                self.handler,
                self.aggregate_id_of,
                self._options(),
                sleep=self._sleep,
                rng=self._rng,
            )
        delivery = Delivery(body, headers, content_type)
        return receiver.receive([delivery], keep=lambda _, verdict: self._keep(verdict, body))[0]

    def _keep(self, verdict: Verdict, body: bytes) -> None:
        assert self.dead_letters is not None
        keep_sync(self.dead_letters, verdict, body, self.queue)

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
        count = 0
        with translated(self._where()):
            if self._connection is None or self._connection.is_closed:
                self._connection = pika.BlockingConnection(self._params)
            channel = self._connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            idle_since = time.monotonic()
            try:
                for method, props, body in channel.consume(self.queue, inactivity_timeout=poll):
                    if method is None:
                        if self._idle(time.monotonic() - idle_since, idle_timeout, stop):
                            break
                        continue
                    verdict = self.decide(body, props.headers, props.content_type)
                    self._account(verdict, bool(method.redelivered), body)
                    self._settle(channel, method.delivery_tag, verdict)
                    if verdict.fatal and verdict.error is not None:
                        raise verdict.error
                    count += 1
                    idle_since = time.monotonic()
                    if self._done(count, max_messages, stop):
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

    def _settle(self, channel: Any, tag: int, verdict: Verdict) -> None:
        if verdict.action is Action.ACK:
            channel.basic_ack(tag)
        elif verdict.action is Action.REQUEUE:
            time.sleep(self.requeue_delay)
            channel.basic_nack(tag, requeue=True)
        else:
            channel.basic_reject(tag, requeue=False)
