"""A publishing connection to RabbitMQ of docoutbox's own: one AMQP 0-9-1 connection with
one confirm-mode channel, written by rounds and settled by the broker's confirms.

Rule (I4 under nacks): a round's entries are written in order, in one write (shared by
every round sent in the same turn of the loop), and get consecutive delivery tags; each
entry gets its own outcome: None once the broker acks it, else its error (a nack, or a
``mandatory`` return, fails that entry only). A round
holds at most one entry per aggregate and the engine republishes an aggregate's run from
its first failure, so per-aggregate first-delivery order holds whatever the broker
confirms later. Every entry still unconfirmed when the channel closes fails with the
broker's reply translated (a 404: ``PermanentPublishError``), and when the connection
closes or goes silent, with ``BrokerUnavailable``; nothing unconfirmed is ever reported
as published.

How: :class:`~docoutbox_rabbitmq.inbound.Reader` parses the broker's bytes in
``data_received``; an ack or nack settles its tag, or with ``multiple`` every tag up to
it, by walking the tags from the lowest unsettled one (each tag is walked once). No
task, queue or future exists per frame or per entry. A ``basic.return`` (method, header,
body frames) fails the oldest unsettled entry whose message id and routing key are the
returned message's (the broker returns messages in the order they were published, each
before its ack, and a returned entry leaves the pending ones), so two rounds in flight
with the same entry id are never confused. The rare frames (handshake, channel open
and close, ``connection.blocked``) are marshalled by pamqp. Heartbeats go both ways: a
broker silent for two intervals is a lost connection. While the broker blocks the
connection (``connection.blocked``) rounds wait, within their deadline.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pamqp.exceptions
import pamqp.frame
from pamqp import commands as spec
from pamqp.base import Frame
from pamqp.header import ContentHeader, ProtocolHeader

from docoutbox.errors import BrokerUnavailable, DocOutboxError, InvalidConfig
from docoutbox_rabbitmq.errors import by_reply_code, connection_failed, nacked, returned
from docoutbox_rabbitmq.inbound import BODY, HEAD, HEADER, HEARTBEAT, METHOD, Reader

#: The heartbeat frame (type 8, channel 0, no payload).
_HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"
#: What a broker that offers no limit gets instead (RabbitMQ's default ``frame_max``).
DEFAULT_FRAME_MAX = 131_072
_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "publisher_confirms": True,
}


@dataclass(frozen=True)
class Address:
    """Where and how to connect, from an ``amqp://`` or ``amqps://`` URL: host, port,
    PLAIN credentials, virtual host, the URL's ``heartbeat`` (None: the broker's) and, for
    ``amqps``, the TLS context (``cafile``, ``capath``, ``certfile``/``keyfile`` and
    ``no_verify_ssl`` as aio-pika reads them)."""

    host: str
    port: int
    username: str
    password: str
    vhost: str
    heartbeat: int | None
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, url: str) -> Address:
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        secure = parts.scheme == "amqps"
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        heartbeat: int | None = None
        if "heartbeat" in query:
            try:
                heartbeat = int(query["heartbeat"])
            except ValueError:
                raise InvalidConfig(f"heartbeat={query['heartbeat']!r} is not a number") from None
        tls = None
        if secure:
            try:
                tls = ssl.create_default_context(
                    cafile=query.get("cafile"), capath=query.get("capath")
                )
                if query.get("certfile"):
                    tls.load_cert_chain(query["certfile"], query.get("keyfile"))
            except (OSError, ssl.SSLError) as exc:
                raise InvalidConfig(f"the URL's TLS files cannot be used: {exc}") from None
            if query.get("no_verify_ssl", "0") != "0":
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
        return cls(
            host=parts.hostname or "localhost",
            port=parts.port or (5671 if secure else 5672),
            username=unquote(parts.username or "guest"),
            password=unquote(parts.password or "guest"),
            vhost=unquote(path) if path else "/",
            heartbeat=heartbeat,
            tls=tls,
        )


#: The error of an entry (described by ``what``) that ``cause`` left unconfirmed.
Failure = Callable[[BaseException, str], DocOutboxError]


class Round:
    """The outcomes of one round, settled entry by entry; ``done`` resolves once every
    entry is settled. ``whats[i]`` describes entry ``i`` in its errors."""

    __slots__ = ("done", "left", "outcomes", "settled", "whats")

    def __init__(
        self, outcomes: list[Exception | None], whats: list[str], done: asyncio.Future[None]
    ) -> None:
        self.outcomes = outcomes
        self.whats = whats
        self.settled = [True] * len(outcomes)
        self.left = 0
        self.done = done

    def expect(self, index: int) -> None:
        self.settled[index] = False
        self.left += 1

    def settle(self, index: int, outcome: Exception | None) -> None:
        if self.settled[index]:
            return
        self.settled[index] = True
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)

    def fail_unsettled(self, error: Failure, cause: BaseException) -> None:
        """Settle every entry still waiting with ``error(cause, what)``."""
        for index, settled in enumerate(self.settled):
            if not settled:
                failure = error(cause, self.whats[index])
                failure.__cause__ = cause
                self.settle(index, failure)


#: One entry awaiting its confirm: its round, index there, message id, routing key.
Slot = tuple[Round, int, str, bytes]


class Link(asyncio.Protocol):
    """One connection and its confirm-mode channel (see the module's rule). Made by
    :func:`connect`; rounds call :meth:`ready` then :meth:`send`."""

    def __init__(self, address: Address, client_properties: dict[str, Any]) -> None:
        self.address = address
        self.client_properties = {**client_properties, "capabilities": _CAPABILITIES}
        self.reader = Reader(self)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.loop = loop
        #: None while usable, else why the connection is gone.
        self.lost: BaseException | None = None
        self.frame_max = DEFAULT_FRAME_MAX
        self.channel_max = 2047
        self.heartbeat = 0
        self.channel = 0
        self.channel_open = False
        #: Delivery tags: the last one sent, the lowest that may be unsettled.
        self.tag = 0
        self.low = 1
        self.pending: dict[int, Slot] = {}
        #: A ``basic.return`` being read: the method, then its header.
        self._return: spec.Basic.Return | None = None
        self._return_header: ContentHeader | None = None
        self._return_left = 0
        self._waiter: tuple[tuple[type[Frame], ...], asyncio.Future[Frame]] | None = None
        self.unblocked = asyncio.Event()
        self.unblocked.set()
        self.writable = asyncio.Event()
        self.writable.set()
        self._heard = True
        self._wrote = False
        self._silent = 0
        self._beat: asyncio.TimerHandle | None = None
        #: Rounds sent in this turn of the loop, written together at its end.
        self._corked: list[bytes] = []

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(pamqp.frame.marshal(ProtocolHeader(), 0))

    def data_received(self, data: bytes) -> None:
        self._heard = True
        try:
            self.reader.feed(data)
        except BrokerUnavailable as exc:  # a malformed stream: nothing more can be trusted
            self.abort(exc)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(exc or ConnectionResetError("the broker closed the connection"))

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    # -- confirms (the fast path) ------------------------------------------------------------

    def ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            pop = self.pending.pop
            for settled in range(self.low, tag + 1):
                slot = pop(settled, None)
                if slot is not None:
                    slot[0].settle(slot[1], None)
            if tag >= self.low:
                self.low = tag + 1
        else:
            slot = self.pending.pop(tag, None)
            if slot is not None:
                slot[0].settle(slot[1], None)
            if tag == self.low:
                self._advance()

    def nack(self, tag: int, multiple: bool) -> None:
        tags = range(self.low, tag + 1) if multiple else (tag,)
        for settled in tags:
            slot = self.pending.pop(settled, None)
            if slot is not None:
                round_, index = slot[0], slot[1]
                round_.settle(index, nacked(round_.whats[index]))
        if multiple and tag >= self.low:
            self.low = tag + 1
        elif tag == self.low:
            self._advance()

    def _advance(self) -> None:
        """Move the lowest unsettled tag past the settled ones (each tag is passed once)."""
        low, last, pending = self.low, self.tag, self.pending
        while low <= last and low not in pending:
            low += 1
        self.low = low

    # -- every other frame ---------------------------------------------------------------------

    def frame(self, kind: int, channel: int, raw: bytes) -> None:
        if kind == HEARTBEAT:
            return
        try:
            _, _, value = pamqp.frame.unmarshal(raw)
        except (pamqp.exceptions.UnmarshalingException, ValueError, KeyError) as exc:
            self.abort(BrokerUnavailable(f"an AMQP frame pamqp cannot read: {exc}"))
            return
        if kind == METHOD:
            self._method(channel, value)
        elif kind == HEADER and self._return is not None and isinstance(value, ContentHeader):
            self._return_header = value
            self._return_left = value.body_size
            if not self._return_left:
                self._returned()
        elif kind == BODY and self._return is not None:
            self._return_left -= len(raw) - HEAD.size - 1
            if self._return_left <= 0:
                self._returned()

    def _method(self, channel: int, value: Any) -> None:
        if isinstance(value, spec.Basic.Return):
            self._return, self._return_header = value, None
        elif isinstance(value, spec.Channel.Close):
            if channel == self.channel:
                self._corked.clear()  # publishes on a closed channel: their entries fail
                self.write(pamqp.frame.marshal(spec.Channel.CloseOk(), channel))
                self._channel_closed(value)
        elif isinstance(value, spec.Connection.Close):
            if self.transport is not None:
                self.write(pamqp.frame.marshal(spec.Connection.CloseOk(), 0))
            self.abort(
                BrokerUnavailable(
                    f"connection closed by the broker ({value.reply_code} {value.reply_text})"
                )
            )
        elif isinstance(value, spec.Connection.Blocked):
            self.unblocked.clear()
        elif isinstance(value, spec.Connection.Unblocked):
            self.unblocked.set()
        elif isinstance(value, spec.Basic.Ack):
            self.ack(value.delivery_tag, value.multiple)
        elif isinstance(value, spec.Basic.Nack):
            self.nack(value.delivery_tag, value.multiple)
        elif self._waiter is not None and isinstance(value, self._waiter[0]):
            future = self._waiter[1]
            self._waiter = None
            if not future.done():
                future.set_result(value)

    def _returned(self) -> None:
        """A whole returned message is read: fail the entry it was (see the module's rule)."""
        method, header = self._return, self._return_header
        self._return, self._return_header = None, None
        if method is None or header is None:
            return
        message_id = header.properties.message_id or ""
        key = (method.routing_key or "").encode("utf-8")
        for tag in range(self.low, self.tag + 1):
            slot = self.pending.get(tag)
            if slot is not None and slot[2] == message_id and slot[3] == key:
                del self.pending[tag]
                round_, index = slot[0], slot[1]
                round_.settle(index, returned([method.reply_code or 0], round_.whats[index]))
                return

    def _channel_closed(self, close: spec.Channel.Close) -> None:
        code, text = close.reply_code or 0, str(close.reply_text)
        self.channel_open = False
        self._settle_all(
            lambda _, what: by_reply_code(code, text, what),
            ConnectionError(f"channel closed by the broker ({code} {text})"),
        )
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter[1].done():
            waiter[1].set_exception(by_reply_code(code, text, "open a confirm channel"))

    def _settle_all(self, error: Failure, cause: BaseException) -> None:
        pending, self.pending = self.pending, {}
        self.tag, self.low = 0, 1
        self._return = self._return_header = None
        for round_, index, _, _ in pending.values():
            if not round_.settled[index]:
                failure = error(cause, round_.whats[index])
                failure.__cause__ = cause
                round_.settle(index, failure)

    # -- the connection's life ---------------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self._wrote = True
        if self._corked:  # rounds sent before this frame go first
            data = b"".join((*self._corked, data))
            self._corked.clear()
        self.transport.write(data)

    def _uncork(self) -> None:
        """Write the rounds sent in the loop's last turn, in the order they were sent."""
        if self._corked and self.lost is None and self.transport is not None:
            self.write(b"")

    def abort(self, reason: BaseException) -> None:
        """End the connection now; every unconfirmed entry fails with ``BrokerUnavailable``."""
        self._gone(reason)
        if self.transport is not None:
            self.transport.abort()

    def _gone(self, reason: BaseException) -> None:
        if self.lost is None:
            self.lost = reason
        self.channel_open = False
        self._corked.clear()
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        self._settle_all(connection_failed, reason)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter[1].done():
            waiter[1].set_exception(connection_failed(reason, "AMQP handshake"))
        self.unblocked.set()  # waiting rounds find the connection lost
        self.writable.set()

    def _tick(self) -> None:
        """Every half heartbeat interval: send a heartbeat if nothing was written, and give
        up on a broker silent for two intervals."""
        self._silent = 0 if self._heard else self._silent + 1
        self._heard = False
        if self._silent >= 4:
            self.abort(TimeoutError(f"no heartbeat from the broker in {2 * self.heartbeat} s"))
            return
        if not self._wrote and self.transport is not None:
            self.transport.write(_HEARTBEAT)
        self._wrote = False
        self._beat = self.loop.call_later(self.heartbeat / 2, self._tick)

    async def call(self, channel: int, method: Frame, *answers: type[Frame]) -> Frame | None:
        """Send ``method`` on ``channel`` and return the broker's answer (one of
        ``answers``; none expected if empty). One call at a time."""
        if self.lost is not None:
            raise connection_failed(self.lost, "AMQP call")
        future: asyncio.Future[Frame] | None = None
        if answers:
            future = self.loop.create_future()
            self._waiter = (answers, future)
        self.write(pamqp.frame.marshal(method, channel))
        return None if future is None else await future

    async def handshake(self) -> None:
        """Start, tune, open the virtual host (after the protocol header is sent)."""
        future: asyncio.Future[Frame] = self.loop.create_future()
        self._waiter = ((spec.Connection.Start,), future)
        await future
        address = self.address
        tune = await self.call(
            0,
            spec.Connection.StartOk(
                client_properties=self.client_properties,
                mechanism="PLAIN",
                response=f"\0{address.username}\0{address.password}",
            ),
            spec.Connection.Tune,
        )
        assert isinstance(tune, spec.Connection.Tune)
        self.frame_max = tune.frame_max or DEFAULT_FRAME_MAX
        self.channel_max = tune.channel_max or 65_535
        heartbeat = tune.heartbeat if address.heartbeat is None else address.heartbeat
        if address.heartbeat and tune.heartbeat:
            heartbeat = min(address.heartbeat, tune.heartbeat)
        self.heartbeat = heartbeat
        await self.call(
            0,
            spec.Connection.TuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=heartbeat
            ),
        )
        await self.call(0, spec.Connection.Open(virtual_host=address.vhost), spec.Connection.OpenOk)
        if heartbeat:
            self._beat = self.loop.call_later(heartbeat / 2, self._tick)

    async def open_channel(self) -> None:
        """A new channel in confirm mode (the next number: a closed one is never reused)."""
        self.channel = self.channel % self.channel_max + 1
        self.tag, self.low = 0, 1
        await self.call(self.channel, spec.Channel.Open(), spec.Channel.OpenOk)
        await self.call(self.channel, spec.Confirm.Select(), spec.Confirm.SelectOk)
        self.channel_open = True

    async def probe(self) -> None:
        """One round trip on the channel (``confirm.select`` again, a no-op for RabbitMQ):
        it finds a connection that died silently."""
        await self.call(self.channel, spec.Confirm.Select(), spec.Confirm.SelectOk)

    async def ready(self) -> None:
        """Wait until rounds may be written: not blocked by the broker, the socket's
        buffer below its high-water mark."""
        while not self.unblocked.is_set() or not self.writable.is_set():
            if self.lost is not None:
                return
            await self.unblocked.wait()
            await self.writable.wait()

    @property
    def max_content(self) -> int:
        """The largest body frame payload (``frame_max`` less a frame's 8 bytes)."""
        return self.frame_max - HEAD.size - 1

    def send(self, payload: bytes, round_: Round, slots: Sequence[tuple[int, str, bytes]]) -> None:
        """Write a round's frames (``payload``, one ``basic.publish`` per slot, in order;
        the round already expects each slot's index) and await each entry's confirm:
        ``slots`` gives (index in the round, message id, routing key) per publish. The
        rounds sent in one turn of the loop go out in one write at its end, in the order
        of their delivery tags (any other frame written meanwhile follows them)."""
        if self.lost is not None:
            raise connection_failed(self.lost, "publish")
        if not self.channel_open:
            raise BrokerUnavailable("publish: the channel is closed")
        if not self._corked:
            self.loop.call_soon(self._uncork)
        self._corked.append(payload)
        self._wrote = True
        tag, pending = self.tag, self.pending
        for index, message_id, key in slots:
            tag += 1
            pending[tag] = (round_, index, message_id, key)
        self.tag = tag

    async def close(self) -> None:
        """Close the connection politely (``connection.close``), or abort it."""
        if self.lost is None and self.transport is not None:
            try:
                async with asyncio.timeout(5):
                    await self.call(
                        0,
                        spec.Connection.Close(200, "closed", 0, 0),
                        spec.Connection.CloseOk,
                    )
            except (DocOutboxError, TimeoutError, OSError):
                pass
        self.abort(ConnectionAbortedError("closed by the publisher"))


async def connect(url: str, client_properties: dict[str, Any], timeout: float) -> Link:
    """A :class:`Link` to ``url``, its handshake done and its channel open in confirm
    mode, within ``timeout`` seconds; ``BrokerUnavailable`` (with the cause) otherwise."""
    address = Address.of(url)
    loop = asyncio.get_running_loop()
    link: Link | None = None

    def made() -> Link:
        nonlocal link
        link = Link(address, client_properties)
        return link

    try:
        async with asyncio.timeout(timeout):
            await loop.create_connection(
                made,
                address.host,
                address.port,
                ssl=address.tls,
                server_hostname=address.host if address.tls else None,
            )
            assert link is not None
            await link.handshake()
            await link.open_channel()
    except BrokerUnavailable:
        if link is not None:
            link.abort(ConnectionAbortedError("handshake failed"))
        raise
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        if link is not None:
            link.abort(exc)
        raise connection_failed(exc, "connect") from exc
    assert link is not None
    return link
