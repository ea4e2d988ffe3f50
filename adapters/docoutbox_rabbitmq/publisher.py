"""Publish outbox entries to RabbitMQ with publisher confirms (pika ``BlockingConnection``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import pika  # type: ignore[import-untyped, unused-ignore]
import pika.exceptions as px  # type: ignore[import-untyped, unused-ignore]

from docoutbox.errors import BrokerUnavailable, PermanentPublishError
from docoutbox.model import OutboxMessage
from docoutbox_rabbitmq.amqp import Routing, declare, masked, pika_parameters
from docoutbox_rabbitmq.errors import MISSING_CODES, translate, translated

log = logging.getLogger("docoutbox.rabbitmq")

#: What pika raises when the broker refuses the user, the password or the vhost.
REFUSED_LOGIN = (
    px.ProbableAuthenticationError,
    px.AuthenticationError,
    px.ProbableAccessDeniedError,
)


@dataclass(eq=False)
class _Link:
    """One thread's connection and confirm-mode channel."""

    connection: Any
    channel: Any = None
    used_at: float = 0.0


class RabbitPublisher(Routing):
    """A :class:`docoutbox.ports.dispatch.Publisher` for RabbitMQ: returns only once confirmed.

    Each entry is published persistent, ``mandatory``, to ``exchange`` with routing key
    ``route(entry)`` if given, else the entry's ``destination``, else ``routing_key``, else
    the entry's ``type``. ``wire`` selects the body: plain docoutbox JSON
    (:func:`docoutbox.codec.encode_entry`, the default) or a CloudEvent in structured or
    binary mode (:func:`~docoutbox_rabbitmq.amqp.message_for`).

    Errors: a nack or a return raises ``PublishError``; a message over
    ``max_message_size`` or refused with 311/406 raises ``PermanentPublishError``; a lost
    connection, a missing exchange or refused access raises ``BrokerUnavailable``, and the
    next call reconnects. An idle connection is probed before use, so one the broker
    closed meanwhile is replaced without failing the publish.

    Options (``routing_key``, ``route``, ``mandatory``, ``max_message_size``,
    ``probe_idle``, ``wire``) are :class:`~docoutbox_rabbitmq.amqp.Routing`'s.

    Threads: pika connections must stay on the thread that opened them. The publisher
    opens one connection per thread, lazily, so one instance can serve a pool of worker
    threads. Call :meth:`close` once the workers have stopped.

    It has no ``publish_many`` (:class:`~docoutbox.ports.dispatch.PipelinedPublisher`):
    pika's blocking channel waits for each confirm inside ``basic_publish``, so a
    dispatcher's publish round goes out one entry at a time on each worker thread, and
    the confirms in flight are one per thread. The aio-pika publishers send a whole
    round first: :class:`~docoutbox_rabbitmq.aio.AsyncRabbitPublisher`, and for threads
    :class:`~docoutbox_rabbitmq.pipelined.PipelinedRabbitPublisher`.
    """

    def __init__(
        self,
        url: str,
        exchange: str = "",
        *,
        connection_name: str = "docoutbox-publisher",
        blocked_timeout: float = 30.0,
        **options: Any,
    ) -> None:
        super().__init__(url, exchange, **options)
        self._params = pika_parameters(url)
        self._params.client_properties = {"connection_name": connection_name}
        self._params.blocked_connection_timeout = blocked_timeout
        self._local = threading.local()
        self._links: list[_Link] = []
        self._lock = threading.Lock()

    def publish(self, entry: OutboxMessage) -> None:
        body, fields, key, what = self.outgoing(entry)
        link = self._link()
        try:
            with translated(what):
                link.channel.basic_publish(
                    self.exchange,
                    key,
                    body,
                    pika.BasicProperties(**fields),
                    mandatory=self.mandatory,
                )
        finally:
            link.used_at = time.monotonic()
            if link.connection.is_closed:
                self._discard(link)  # a closed channel alone is reopened by the next call

    def declare(
        self,
        *,
        exchange_type: str = "topic",
        queues: Mapping[str, Iterable[str]] | None = None,
        dead_letters: str | None = None,
    ) -> None:
        """:func:`declare` this publisher's exchange, on the calling thread's connection."""
        link = self._link()
        try:
            declare(
                link.channel,
                self.exchange,
                exchange_type=exchange_type,
                queues=queues,
                dead_letters=dead_letters,
            )
        finally:
            if link.connection.is_closed:
                self._discard(link)

    def check(self, *, declare_type: str | None = None) -> None:
        """Fail fast on a broker this publisher cannot use: connect, log in, and make sure
        the exchange exists (declaring it, durable, of ``declare_type`` when given).

        Raises :class:`~docoutbox.errors.BrokerUnavailable` when the broker cannot be
        reached, and :class:`~docoutbox.errors.PermanentPublishError` when it refuses the
        credentials or the exchange does not exist.
        """
        where = masked(self._url)
        try:
            link = self._link()
        except BrokerUnavailable as exc:
            cause = exc.__cause__
            if isinstance(
                cause,
                px.ProbableAuthenticationError
                | px.AuthenticationError
                | px.ProbableAccessDeniedError,
            ):
                raise PermanentPublishError(
                    f"RabbitMQ at {where} refused the credentials ({type(cause).__name__})"
                ) from exc
            raise
        try:
            if declare_type is not None:
                self.declare(exchange_type=declare_type)
            elif self.exchange:
                try:
                    link.channel.exchange_declare(self.exchange, passive=True)
                except px.ChannelClosedByBroker as exc:
                    if int(exc.reply_code) in MISSING_CODES:
                        raise PermanentPublishError(
                            f"exchange {self.exchange!r} does not exist on {where}; declare "
                            f"it, or start with --declare-exchange"
                        ) from exc
                    raise translate(exc, f"check exchange {self.exchange!r}") from exc
                except (px.AMQPError, OSError) as exc:
                    raise translate(exc, f"check exchange {self.exchange!r}") from exc
        finally:
            if link.connection.is_closed:
                self._discard(link)

    def close(self) -> None:
        """Close every thread's connection. A later publish opens a new one."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            _close_quietly(link.connection)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _link(self) -> _Link:
        link: _Link | None = getattr(self._local, "link", None)
        if link is not None and not self._alive(link):
            self._discard(link)
            link = None
        if link is None:
            with translated(f"connect to {masked(self._url)}"):
                link = _Link(pika.BlockingConnection(self._params))
            self._local.link = link
            with self._lock:
                self._links.append(link)
        if link.channel is None or link.channel.is_closed:
            try:
                with translated(f"open a channel on {masked(self._url)}"):
                    link.channel = link.connection.channel()
                    link.channel.confirm_delivery()
            except BaseException:
                self._discard(link)
                raise
            link.used_at = time.monotonic()
        return link

    def _alive(self, link: _Link) -> bool:
        if link.connection.is_closed:
            return False
        if time.monotonic() - link.used_at < self.probe_idle:
            return True
        try:
            link.connection.process_data_events(time_limit=0)
        except (px.AMQPError, OSError) as exc:
            log.info("reconnecting to %s: %r", masked(self._url), exc)
            return False
        return bool(link.connection.is_open)

    def _discard(self, link: _Link) -> None:
        if getattr(self._local, "link", None) is link:
            self._local.link = None
        with self._lock:
            if link in self._links:
                self._links.remove(link)
        _close_quietly(link.connection)


def _close_quietly(connection: Any) -> None:
    if connection.is_closed:
        return
    try:
        connection.close()
    except (px.AMQPError, OSError) as exc:  # already broken: nothing left to release
        log.debug("closing a broken RabbitMQ connection: %r", exc)
