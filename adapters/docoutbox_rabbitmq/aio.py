"""asyncio twins of the RabbitMQ publisher and consumer: the consumer, declarations and
checks on aio-pika, publishing on docoutbox's own connection (:mod:`~docoutbox_rabbitmq.link`).

They share the sync adapter's decisions: message properties and topology
(:mod:`~docoutbox_rabbitmq.amqp`), error mapping by reply code
(:mod:`~docoutbox_rabbitmq.errors`) and how a delivery is settled
(:mod:`docoutbox.receive`, with the consumer's settings, counts and logs in
:class:`~docoutbox_rabbitmq.consumer.Settlement`). Only the I/O differs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import aio_pika
import aio_pika.message
import aiormq.exceptions as ax
from pamqp.commands import Basic
from pydantic import BaseModel

from docoutbox.errors import BrokerUnavailable, DocOutboxError, PermanentPublishError, PublishError
from docoutbox.handlers import Handler
from docoutbox.model import OutboxMessage
from docoutbox.receive import (
    Action,
    AnyRejects,
    AsyncReceiver,
    ConsumerStats,
    Delivery,
    Stop,
    Verdict,
    keep_async,
)
from docoutbox.store.api import AsyncAggregateStore
from docoutbox_rabbitmq import frames
from docoutbox_rabbitmq.amqp import Routing, masked, topology
from docoutbox_rabbitmq.consumer import Settlement
from docoutbox_rabbitmq.errors import by_reply_code, connection_failed, nacked, returned
from docoutbox_rabbitmq.link import Address, Link, connect
from docoutbox_rabbitmq.rounds import Outgoing, message_id_of, publish_round

S = TypeVar("S", bound=BaseModel)
log = logging.getLogger("docoutbox.rabbitmq")

#: aio-pika's channel-closing exceptions by AMQP reply code.
_CHANNEL_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ax.ChannelAccessRefused, 403),
    (ax.ChannelNotFoundEntity, 404),
    (ax.ChannelLockedResource, 405),
    (ax.ChannelPreconditionFailed, 406),
)
#: Errors that mean the connection (or its channel) is gone or unusable.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    ax.AMQPConnectionError,
    ax.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    TimeoutError,
    RuntimeError,  # aiormq: "<Connection ...> closed"
)


def translate(exc: BaseException, what: str) -> DocOutboxError:
    """The docoutbox error for an aio-pika (aiormq, socket) error raised while doing ``what``."""
    if isinstance(exc, ax.DeliveryError):
        frame = exc.frame
        if isinstance(frame, Basic.Return):
            return returned([int(frame.reply_code or 0)], what)
        return nacked(what)
    for kind, code in _CHANNEL_CODES:
        if isinstance(exc, kind):
            return by_reply_code(code, str(exc.args[0] if exc.args else ""), what)
    if isinstance(exc, ax.ChannelClosed):
        code, text = (*exc.args, None, None)[:2]
        if isinstance(code, int):
            return by_reply_code(code, str(text), what)
        return BrokerUnavailable(f"{what}: channel closed: {exc!r}")
    if isinstance(exc, _CONNECTION_ERRORS):
        return connection_failed(exc, what)
    return PublishError(f"{what}: {type(exc).__name__}: {exc}")


#: What :func:`translated` turns into docoutbox's publish errors.
_TRANSLATED: tuple[type[BaseException], ...] = (TimeoutError, ax.AMQPError, OSError, RuntimeError)


@asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    """Re-raise aio-pika and socket errors as docoutbox's publish errors."""
    try:
        yield
    except _TRANSLATED as exc:
        raise translate(exc, what) from exc


def amqp_properties(fields: Mapping[str, Any]) -> Basic.Properties:
    """The AMQP properties ``aio_pika.Message(body, **fields).properties`` gives, for the
    fields of :func:`~docoutbox_rabbitmq.amqp.message_for`, built without the message
    object (its checked attribute setters took about 16 µs per publish). Other fields go
    the long way."""
    if not fields.keys() <= frames.FIELDS:
        return aio_pika.Message(b"", **fields).properties
    timestamp = fields.get("timestamp")
    correlation_id = fields.get("correlation_id")
    return Basic.Properties(
        content_type=fields.get("content_type"),
        correlation_id=None if correlation_id is None else str(correlation_id),
        delivery_mode=int(fields.get("delivery_mode") or 1),
        headers=fields.get("headers") or {},
        message_id=fields.get("message_id"),
        message_type=fields.get("type"),
        priority=0,
        timestamp=None if timestamp is None else aio_pika.message.encode_timestamp(timestamp),
    )


class AsyncRabbitPublisher(Routing):
    """A :class:`docoutbox.AsyncPublisher` for RabbitMQ: returns only once confirmed.

    The twin of :class:`~docoutbox_rabbitmq.RabbitPublisher`: the same routing, message
    properties, body and errors; a returned (unroutable) ``mandatory`` message raises
    ``PublishError``. Publishing runs on a connection of its own
    (:mod:`~docoutbox_rabbitmq.link`: handshake, TLS for ``amqps``, heartbeats both
    ways, ``connection.blocked``, one confirm-mode channel). ``publish_many`` writes a
    whole round's frames at once and then awaits the confirms
    (:class:`~docoutbox.ports.dispatch.AsyncPipelinedPublisher`, in
    :mod:`~docoutbox_rabbitmq.rounds`); ``publish`` is a round of one, and concurrent
    calls share the channel, so a dispatcher keeps many messages in flight. A lost
    connection raises ``BrokerUnavailable`` and the next call reconnects. ``declare`` and
    ``check`` each open an aio-pika connection and close it before they return, so a
    publisher holds one connection to the broker (its own) once checked, and none once
    closed. Options as the twin's (:class:`~docoutbox_rabbitmq.amqp.Routing`).
    """

    def __init__(
        self,
        url: str,
        exchange: str = "",
        *,
        connection_name: str = "docoutbox-publisher",
        timeout: float = 30.0,
        **options: Any,
    ) -> None:
        super().__init__(url, exchange, **options)
        Address.of(url)  # an unusable heartbeat or TLS file fails here, not at a publish
        self.connection_name = connection_name
        self.timeout = timeout
        self._url = url
        self._link: Link | None = None
        self._lock = asyncio.Lock()
        self._used_at = 0.0
        #: Rounds awaiting their confirms: the idle probe never runs under them.
        self._in_flight = 0

    async def publish(self, entry: OutboxMessage) -> None:
        """Publish ``entry`` and return once the broker confirms it: a round of one."""
        outcome = (await self.publish_many([entry]))[0]
        if outcome is not None:
            raise outcome

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """Publish every entry on the confirm-mode channel in one write, then await the
        confirms (:mod:`~docoutbox_rabbitmq.rounds`): one outcome per entry, None once
        confirmed, else the error ``publish`` would raise for it. A nack or return of one
        entry does not touch the others (they are independent: see
        :class:`~docoutbox.ports.dispatch.PipelinedPublisher`); a connection lost with
        entries in flight fails those not yet confirmed with ``BrokerUnavailable``, and
        the next call reconnects. The whole round has one deadline, ``timeout``."""
        if not entries:
            return []
        outcomes: list[Exception | None] = [None] * len(entries)
        sends: list[tuple[int, Outgoing]] = []
        for index, entry in enumerate(entries):
            try:
                sends.append((index, self._outgoing(entry)))
            except DocOutboxError as exc:  # this entry's outcome; the others are independent
                outcomes[index] = exc
        if not sends:
            return outcomes
        try:
            link = await self._open()
        except DocOutboxError as exc:  # nothing was sent
            for index, _ in sends:
                outcomes[index] = exc
            return outcomes
        self._in_flight += 1
        try:
            await publish_round(link, self.exchange, self.mandatory, sends, outcomes, self.timeout)
        finally:
            self._in_flight -= 1
            self._used_at = link.loop.time()
        if any(isinstance(outcome, BrokerUnavailable) for outcome in outcomes):
            await self._drop(link)  # the next call reconnects
        return outcomes

    def _outgoing(self, entry: OutboxMessage) -> Outgoing:
        """``entry`` encoded for a round: routing key, properties, body, message id."""
        body, fields, key, what = self.outgoing(entry)
        message_id = message_id_of(fields)
        if fields.keys() <= frames.FIELDS:
            props = frames.properties(fields)
        else:
            props = amqp_properties(fields).marshal()
        return Outgoing(frames.short_string(key, "routing key"), props, body, message_id, what)

    async def declare(
        self,
        *,
        exchange_type: str = "topic",
        queues: Mapping[str, Iterable[str]] | None = None,
        dead_letters: str | None = None,
    ) -> None:
        """Declare this publisher's exchange and queues (as :func:`~docoutbox_rabbitmq.declare`),
        on a connection closed once they are declared."""
        async with self._declaring() as channel:
            await declare_async(
                channel,
                self.exchange,
                exchange_type=exchange_type,
                queues=queues,
                dead_letters=dead_letters,
            )

    async def check(self, *, declare_type: str | None = None) -> None:
        """Fail fast on a broker this publisher cannot use (as
        :meth:`~docoutbox_rabbitmq.RabbitPublisher.check`): connect, log in, and make sure
        the exchange exists (declaring it, durable, of ``declare_type`` when given), then
        open the publishing connection.

        Raises ``BrokerUnavailable`` when the broker cannot be reached, and
        ``PermanentPublishError`` when it refuses the credentials or the exchange does not
        exist.
        """
        where = masked(self._url)
        try:
            async with self._declaring() as channel:
                if declare_type is not None:
                    await declare_async(channel, self.exchange, exchange_type=declare_type)
                elif self.exchange:
                    await self._check_exchange(channel)
        except BrokerUnavailable as exc:
            if isinstance(exc.__cause__, ax.AuthenticationError | ax.ProbableAuthenticationError):
                raise PermanentPublishError(
                    f"RabbitMQ at {where} refused the credentials ({type(exc.__cause__).__name__})"
                ) from exc
            raise
        await self._open()

    async def _check_exchange(self, channel: aio_pika.abc.AbstractChannel) -> None:
        try:
            await channel.get_exchange(self.exchange, ensure=True)
        except ax.ChannelNotFoundEntity as exc:
            raise PermanentPublishError(
                f"exchange {self.exchange!r} does not exist on {masked(self._url)}; declare "
                f"it, or start with --declare-exchange"
            ) from exc
        except (ax.AMQPError, OSError, RuntimeError, TimeoutError) as exc:
            raise translate(exc, f"check exchange {self.exchange!r}") from exc

    async def close(self) -> None:
        """Close the connection. A later publish opens a new one."""
        async with self._lock:
            await self._discard()

    async def _drop(self, link: Link) -> None:
        """After a round on ``link`` found the broker unavailable: discard the connection,
        unless another call replaced it meanwhile (under the lock, so never while another
        call is opening a connection)."""
        async with self._lock:
            if self._link is link:
                await self._discard()

    async def _discard(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _open(self) -> Link:
        """The publishing connection with its confirm-mode channel open, reconnecting if
        needed. After ``probe_idle`` seconds unused, and with no round awaiting its
        confirms, one round trip on the channel comes first: it finds a connection the
        broker or the network closed meanwhile, which is replaced before the publish."""
        async with self._lock:
            for attempt in (1, 2):  # nothing is published here: a retry sends nothing twice
                try:
                    return await self._open_once()
                except BrokerUnavailable:
                    await self._discard()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    async def _open_once(self) -> Link:
        where = masked(self._url)
        link = self._link
        if link is None or link.lost is not None:
            self._link = None
            try:
                link = await connect(
                    self._url, {"connection_name": self.connection_name}, self.timeout
                )
            except BrokerUnavailable as exc:
                raise BrokerUnavailable(f"connect to {where}: {exc}") from exc
            self._link = link
            self._used_at = link.loop.time()
            return link
        try:
            async with asyncio.timeout(self.timeout):
                if not link.channel_open:
                    await link.open_channel()
                    self._used_at = link.loop.time()
                elif link.loop.time() - self._used_at >= self.probe_idle and not self._in_flight:
                    await link.probe()
        except TimeoutError as exc:
            link.abort(exc)
            raise connection_failed(exc, f"probe {where}") from exc
        except DocOutboxError as exc:
            raise BrokerUnavailable(f"open a channel on {where}: {exc}") from exc
        return link

    @asynccontextmanager
    async def _declaring(self) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
        """An aio-pika channel for declarations and checks, on a connection of its own,
        closed when the block ends (however it ends): the publisher keeps no connection
        but its publishing one."""
        where = masked(self._url)
        async with translated(f"connect to {where}"):
            connection = await aio_pika.connect(
                self._url,
                client_properties={"connection_name": self.connection_name},
                timeout=self.timeout,
            )
        try:
            async with translated(f"open a channel on {where}"):
                channel = await connection.channel()
            yield channel
        finally:
            await _close_quietly(connection)


async def _close_quietly(connection: aio_pika.abc.AbstractConnection) -> None:
    """Close ``connection``; one already broken is only logged (its error, if any, is the
    caller's to report)."""
    if connection.is_closed:
        return
    try:
        await connection.close()
    except (ax.AMQPError, OSError, RuntimeError) as exc:
        log.debug("closing a broken RabbitMQ connection: %r", exc)


async def declare_async(
    channel: aio_pika.abc.AbstractChannel,
    exchange: str,
    *,
    exchange_type: str = "topic",
    queues: Mapping[str, Iterable[str]] | None = None,
    dead_letters: str | None = None,
) -> None:
    """The async twin of :func:`~docoutbox_rabbitmq.declare` (the same topology)."""
    steps = topology(
        exchange, exchange_type=exchange_type, queues=queues, dead_letters=dead_letters
    )
    async with translated("declare topology"):
        for step in steps:
            if step.kind == "exchange":
                await channel.declare_exchange(
                    step.name, aio_pika.ExchangeType(step.exchange_type), durable=True
                )
            elif step.kind == "queue":
                await channel.declare_queue(step.name, durable=True, arguments=step.arguments)
            else:
                queue = await channel.get_queue(step.name, ensure=False)
                await queue.bind(step.exchange, routing_key=step.key or None)


class AsyncRabbitConsumer(Settlement[AsyncAggregateStore[S], AnyRejects], Generic[S]):
    """The asyncio twin of :class:`~docoutbox_rabbitmq.RabbitConsumer`, over an
    :class:`~docoutbox.AsyncAggregateStore`, with the same options and behaviour: each
    delivery is handled with ``await store.handle``, a failing handler is retried
    (``retry``), a rejected delivery is kept in ``dead_letters`` (sync or async, e.g.
    ``AsyncMongoDeadLetters``) or requeued if that fails, and settled as
    :mod:`docoutbox.receive` decides. Deliveries are handled one at a time, in order.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        store: AsyncAggregateStore[S],
        handler: Handler[S],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **options: Any,
    ) -> None:
        super().__init__(url, queue, store, handler, **options)
        self._sleep = sleep
        self._connection: aio_pika.abc.AbstractConnection | None = None

    async def decide(
        self,
        body: bytes,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> Verdict:
        """Handle one delivery against the store and decide how to settle it, keeping it
        in the dead letters if rejected. No broker I/O."""

        async def keep(_: int, verdict: Verdict) -> None:
            assert self.dead_letters is not None
            await keep_async(self.dead_letters, verdict, body, self.queue)

        receiver: AsyncReceiver[S] | None = self._receiver
        if receiver is None:
            receiver = self._receiver = AsyncReceiver(
                self.store,
                self.handler,
                self.aggregate_id_of,
                self._options(),
                sleep=self._sleep,
                rng=self._rng,
            )
        return (await receiver.receive([Delivery(body, headers, content_type)], keep=keep))[0]

    async def run(
        self,
        *,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        stop: Stop | None = None,
        poll: float = 0.1,
    ) -> ConsumerStats:
        """Consume until ``max_messages`` deliveries, ``idle_timeout`` seconds without one,
        or ``stop`` is set. Raises ``BrokerUnavailable`` if the connection fails (unacked
        deliveries come again), and a permanent store error after requeueing its delivery.
        """
        where = self._where()
        loop = asyncio.get_running_loop()
        count = 0
        async with translated(where):
            if self._connection is None or self._connection.is_closed:
                self._connection = await aio_pika.connect(
                    self._url, client_properties={"connection_name": self._connection_name}
                )
            channel = await self._connection.channel()
            try:
                await channel.set_qos(prefetch_count=self.prefetch)
                queue = await channel.get_queue(self.queue, ensure=False)
                inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
                await queue.consume(inbox.put)
                idle_since = loop.time()
                while True:
                    try:
                        if inbox.empty():
                            delivery = await asyncio.wait_for(inbox.get(), poll)
                        else:  # prefetched meanwhile: no timer (wait_for makes a task each)
                            delivery = inbox.get_nowait()
                    except TimeoutError:
                        if channel.is_closed:
                            self._connection = None
                            raise BrokerUnavailable(f"{where}: the channel closed") from None
                        if self._idle(loop.time() - idle_since, idle_timeout, stop):
                            break
                        continue
                    body = delivery.body
                    verdict = await self.decide(body, delivery.headers, delivery.content_type)
                    self._account(verdict, bool(delivery.redelivered), body)
                    await self._settle(delivery, verdict)
                    if verdict.fatal and verdict.error is not None:
                        raise verdict.error
                    count += 1
                    idle_since = loop.time()
                    if self._done(count, max_messages, stop):
                        break
            finally:
                if not channel.is_closed:
                    await channel.close()  # unacked deliveries go back to the queue
        return self.stats

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and not connection.is_closed:
            async with translated(f"close {masked(self._url)}"):
                await connection.close()

    async def _settle(
        self, delivery: aio_pika.abc.AbstractIncomingMessage, verdict: Verdict
    ) -> None:
        if verdict.action is Action.ACK:
            await delivery.ack()
        elif verdict.action is Action.REQUEUE:
            await asyncio.sleep(self.requeue_delay)
            await delivery.nack(requeue=True)
        else:
            await delivery.reject(requeue=False)
