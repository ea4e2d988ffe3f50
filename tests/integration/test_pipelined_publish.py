"""Publish rounds on the real brokers: every entry of a round is in flight before the first
confirm, each gets its own outcome, and a dispatcher keeps per-aggregate first-delivery
order (I4) and loses nothing while the broker refuses entries in the middle of rounds.

RabbitMQ runs on the publisher's own connection (``docoutbox_rabbitmq.link``):
``AsyncRabbitPublisher`` for the asyncio dispatcher, and ``PipelinedRabbitPublisher`` (the
same on a loop thread of its own) for the threaded one; a fake socket stands in for the
broker where a test needs to say exactly which frames come back.
RabbitMQ faults: a queue of ``x-max-length`` with ``x-overflow: reject-publish`` (the
broker nacks what does not fit) and an unroutable ``mandatory`` publish (returned).
Kafka faults: a record over ``message.max.bytes`` in the middle of a round, and a proxy
that cuts the connection while rounds are in flight.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pamqp.frame
import pika
import pytest
from pamqp.body import ContentBody
from pamqp.commands import Basic, Channel, Connection
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from benchmarks.ledger import make_entry
from benchmarks.rabbit import Sandbox
from benchmarks.servers import Topics
from docoutbox.codec import decode_entry
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.errors import BrokerUnavailable, PermanentPublishError, PublishError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import AsyncPipelinedPublisher, PipelinedPublisher
from docoutbox.store.document import partition_of, utcnow
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_kafka import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.link import _HEARTBEAT, Address, Link
from docoutbox_rabbitmq.pipelined import PipelinedRabbitPublisher
from tests.conftest import missing
from tests.support.e2e import broker_address, require_rabbitmq, through
from tests.support.kafka import proxied_ports
from tests.support.tcpproxy import TcpProxy

AGGREGATES = 12
PER_AGGREGATE = 4


def pending_backend(aggregates: int, per_aggregate: int) -> MemoryBackend:
    """Documents with ``per_aggregate`` pending entries each, as a store writes them."""
    backend = MemoryBackend()
    created = utcnow() - timedelta(seconds=1)  # Kafka refuses timestamps in the future
    for a in range(aggregates):
        aggregate = f"agg-{a:02d}"
        outbox = [
            {
                "id": f"{aggregate}-{seq}",
                "type": "Added",
                "payload": {"n": seq},
                "created_at": created,
                "seq": seq,
                "aggregate_id": aggregate,
                "aggregate_type": "Counter",
            }
            for seq in range(1, per_aggregate + 1)
        ]
        backend.docs[aggregate] = {
            "_id": aggregate,
            "partition": partition_of(aggregate, 16),
            "version": per_aggregate,
            "outbox": outbox,
            "outbox_seq": per_aggregate,
        }
    return backend


def config() -> DispatcherConfig:
    return DispatcherConfig.polling(
        0.05,
        concurrency=3,
        run_batch=4,
        policy=DispatchPolicy(max_attempts=10_000, base_delay=0.01, max_delay=0.05),
    )


def first_deliveries_in_order(received: Sequence[OutboxMessage]) -> dict[str, list[int]]:
    """Per aggregate, the ``seq`` of each entry at its first delivery, in delivery order."""
    firsts: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for entry in received:
        if entry.id not in seen:
            seen.add(entry.id)
            firsts[str(entry.aggregate_id)].append(entry.seq)
    return dict(firsts)


def wait_until_trimmed(backend: MemoryBackend, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while any(doc.get("outbox") for doc in list(backend.docs.values())):
        assert time.monotonic() < deadline, "entries still pending"
        time.sleep(0.02)


# -- RabbitMQ (the publisher's own connection) ---------------------------------------------


@pytest.fixture(scope="module")
def url() -> str:
    return require_rabbitmq()


def bounded_queue(box: Sandbox, length: int) -> tuple[str, str]:
    """An exchange routing everything to a queue that refuses (nacks) what exceeds
    ``length`` messages."""
    exchange, queue, _ = box.names()
    box.channel.exchange_declare(exchange, "topic", durable=True)
    arguments = {"x-max-length": length, "x-overflow": "reject-publish"}
    box.channel.queue_declare(queue, durable=True, arguments=arguments)
    box.channel.queue_bind(queue, exchange, "#")
    return exchange, queue


class _Wire(asyncio.Transport):
    """The socket of a :class:`Link` with no broker: the test reads what was written and
    answers with frames of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def frames(self) -> list[Any]:
        """Every frame written since the last call, decoded by pamqp."""
        data, self.written = b"".join(self.written), []
        decoded = []
        while data:
            used, _, frame = pamqp.frame.unmarshal(data)
            data = data[used:]
            decoded.append(frame)
        return decoded

    def sent(self) -> list[str]:
        """The message ids of the publishes written since the last call, in order."""
        return [f.properties.message_id for f in self.frames() if isinstance(f, ContentHeader)]


def open_link(heartbeat: int = 0) -> tuple[Link, _Wire]:
    """A :class:`Link` whose handshake is done and whose channel 1 is open, on a
    :class:`_Wire` (call inside a running loop)."""
    link = Link(Address.of("amqp://guest:guest@127.0.0.1:1/"), {})
    wire = _Wire()
    link.connection_made(wire)
    wire.frames()  # the protocol header
    link.channel, link.channel_open, link.heartbeat = 1, True, heartbeat
    return link, wire


def answer(link: Link, *frames: Any, channel: int = 1) -> None:
    """The broker's ``frames`` on ``channel``, arriving in one read."""
    link.data_received(b"".join(pamqp.frame.marshal(f, channel) for f in frames))


def returned_message(message_id: str, key: str) -> list[Any]:
    """The frames of a ``basic.return`` (method, header, body) of an unroutable publish."""
    body = b'{"x": 1}'
    header = ContentHeader(0, len(body), Basic.Properties(message_id=message_id))
    return [Basic.Return(312, "NO_ROUTE", "ex", key), header, ContentBody(body)]


def publisher_on(link: Link, timeout: float = 30.0, **options: Any) -> AsyncRabbitPublisher:
    publisher = AsyncRabbitPublisher(
        "amqp://guest:guest@127.0.0.1:1/", "ex", timeout=timeout, **options
    )

    async def opened() -> Link:
        return link

    publisher._open = opened  # type: ignore[method-assign]
    return publisher


async def turn() -> None:
    """Let the publishing tasks run until they wait for the broker."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_rabbitmq_round_has_one_deadline_and_fails_only_what_it_did_not_confirm() -> None:
    """The asyncio publisher bounds a whole round by ``timeout``: an entry still
    unconfirmed then fails with ``BrokerUnavailable``, and its late confirm is ignored;
    the others keep their own outcomes, in order."""

    async def round_() -> tuple[list[Exception | None], list[str], Link]:
        link, wire = open_link()
        publisher = publisher_on(link, timeout=0.05)
        entries = [make_entry(id=i) for i in ("a", "b", "c")]
        sending = asyncio.ensure_future(publisher.publish_many(entries))
        await turn()
        sent = wire.sent()
        answer(link, Basic.Ack(1), Basic.Ack(3))
        outcomes = await sending
        answer(link, Basic.Ack(2))  # late: nothing left to settle
        return outcomes, sent, link

    outcomes, sent, link = asyncio.run(round_())
    assert sent == ["a", "b", "c"]
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], BrokerUnavailable)
    assert "publish entry b " in str(outcomes[1]) and "timed out" in str(outcomes[1])
    assert "127.0.0.1:1" in str(outcomes[1])
    assert link.pending == {}


@pytest.mark.parametrize(
    ("close", "expected"),
    [
        (Channel.Close(404, "NOT_FOUND - no exchange 'ex'", 60, 40), PermanentPublishError),
        (Connection.Close(320, "CONNECTION_FORCED", 0, 0), BrokerUnavailable),
        (None, BrokerUnavailable),  # the socket ends
    ],
)
def test_a_channel_closing_mid_round_fails_only_the_unconfirmed_entries(
    close: Any, expected: type[Exception]
) -> None:
    """A nack, a return, an ack, then the channel or the connection closes: each entry
    keeps what the broker said, and the unconfirmed ones take the close reason,
    translated; the close is answered."""

    async def round_() -> tuple[list[Exception | None], list[Any], Link]:
        link, wire = open_link()
        sending = asyncio.ensure_future(
            publisher_on(link).publish_many([make_entry(id=f"e{i}") for i in range(6)])
        )
        await turn()
        wire.frames()
        answer(link, Basic.Ack(1), Basic.Nack(2), *returned_message("e2", "Event"))
        answer(link, Basic.Ack(4, multiple=True))
        if close is None:
            link.connection_lost(None)
        else:
            answer(link, close, channel=1 if isinstance(close, Channel.Close) else 0)
        return await sending, wire.frames(), link

    outcomes, replies, link = asyncio.run(round_())
    assert outcomes[0] is None and outcomes[3] is None
    assert type(outcomes[1]) is PublishError and "nack" in str(outcomes[1]).lower()
    assert type(outcomes[2]) is PublishError and "312" in str(outcomes[2])
    assert all(type(o) is expected for o in outcomes[4:]), outcomes
    if isinstance(close, Channel.Close):
        assert "404" in str(outcomes[4])
        assert [type(r) for r in replies] == [Channel.CloseOk] and not link.channel_open
        assert link.lost is None  # the connection stays; the next round opens a channel
    elif close is not None:
        assert [type(r) for r in replies] == [Connection.CloseOk] and link.lost is not None


@pytest.mark.parametrize("keys", [("nowhere", "Event"), ("Event", "nowhere")])
def test_a_return_fails_the_entry_it_was_even_when_another_round_has_its_id(
    keys: tuple[str, str],
) -> None:
    """Two rounds hold an entry with the same id, one to a routing key with no queue:
    the broker returns that one (before it acks it, while the other may still await its
    ack), and the return is matched by message id, routing key and order, so only that
    round's entry fails."""

    async def rounds() -> list[list[Exception | None]]:
        link, _ = open_link()
        publisher = publisher_on(link, route=lambda e: str(e.headers["to"]))
        sending = [
            asyncio.ensure_future(
                publisher.publish_many([make_entry(id="same", headers={"to": key})])
            )
            for key in keys
        ]
        await turn()
        returned_tag = keys.index("nowhere") + 1
        answer(link, *returned_message("same", "nowhere"), Basic.Ack(returned_tag))
        answer(link, Basic.Ack(3 - returned_tag))
        return [await s for s in sending]

    outcomes = asyncio.run(rounds())
    for key, outcome in zip(keys, outcomes, strict=True):
        if key == "nowhere":
            assert type(outcome[0]) is PublishError and "unroutable" in str(outcome[0])
        else:
            assert outcome == [None]


def test_rounds_sent_in_one_turn_of_the_loop_go_out_in_one_write_in_tag_order() -> None:
    """Concurrent rounds share one socket write at the end of the loop's turn, their
    publishes in the order of their delivery tags; a frame written meanwhile (here the
    answer to a channel close) follows them, and a round still corked when the channel
    closes is never written."""

    async def rounds() -> tuple[int, list[str], list[list[Exception | None]], list[Any]]:
        link, wire = open_link()
        publisher = publisher_on(link)
        first = [make_entry(id=i) for i in ("a", "b")]
        second = [make_entry(id=i) for i in ("c", "d", "e")]
        sending = asyncio.gather(publisher.publish_many(first), publisher.publish_many(second))
        await turn()
        writes = len(wire.written)
        sent = wire.sent()
        answer(link, Basic.Ack(5, multiple=True))
        outcomes = list(await sending)
        late = asyncio.ensure_future(publisher.publish_many([make_entry(id="f")]))
        for _ in range(3):  # the round is sent, not yet written
            await asyncio.sleep(0)
            if link.pending:
                break
        answer(link, Channel.Close(404, "NOT_FOUND - no exchange 'ex'", 60, 40))
        outcomes.append(await late)
        return writes, sent, outcomes, wire.frames()

    writes, sent, outcomes, after_close = asyncio.run(rounds())
    assert writes == 1
    assert sent == ["a", "b", "c", "d", "e"]
    assert outcomes[:2] == [[None, None], [None, None, None]]
    assert isinstance(outcomes[2][0], PermanentPublishError)
    assert [type(frame) for frame in after_close] == [Channel.CloseOk]


def test_a_multiple_nack_fails_every_entry_up_to_its_tag_and_no_other() -> None:
    async def round_() -> list[Exception | None]:
        link, _ = open_link()
        sending = asyncio.ensure_future(
            publisher_on(link).publish_many([make_entry(id=f"m{i}") for i in range(5)])
        )
        await turn()
        answer(link, Basic.Ack(1), Basic.Nack(3, multiple=True), Basic.Ack(5, multiple=True))
        return await sending

    outcomes = asyncio.run(round_())
    assert outcomes[0] is None and outcomes[3:] == [None, None]
    assert all(type(o) is PublishError and "nack" in str(o) for o in outcomes[1:3]), outcomes


def test_frames_split_anywhere_settle_the_same_round() -> None:
    """The broker's confirms and a return, cut into reads of one byte: the same outcomes."""

    async def round_() -> list[Exception | None]:
        link, _ = open_link()
        sending = asyncio.ensure_future(
            publisher_on(link).publish_many([make_entry(id=f"e{i}") for i in range(4)])
        )
        await turn()
        answers = [*returned_message("e1", "Event"), Basic.Ack(2, multiple=True)]
        answers += [Basic.Nack(3), Basic.Ack(4)]
        data = b"".join(pamqp.frame.marshal(f, 1) for f in answers)
        for offset in range(len(data)):
            link.data_received(data[offset : offset + 1])
        return await sending

    outcomes = asyncio.run(round_())
    assert outcomes[0] is None and outcomes[3] is None
    assert "312" in str(outcomes[1]) and "nack" in str(outcomes[2]).lower()


def test_a_blocked_connection_holds_rounds_until_unblocked_within_the_deadline() -> None:
    """``connection.blocked``: nothing is written until ``connection.unblocked``; a round
    still blocked at its deadline fails with ``BrokerUnavailable`` having sent nothing."""

    async def rounds() -> tuple[list[Exception | None], list[Exception | None], list[str]]:
        link, wire = open_link()
        answer(link, Connection.Blocked("low on memory"), channel=0)
        expired = await publisher_on(link, timeout=0.05).publish_many([make_entry(id="x")])
        waiting = asyncio.ensure_future(publisher_on(link).publish_many([make_entry(id="y")]))
        await turn()
        assert wire.sent() == []
        answer(link, Connection.Unblocked(), channel=0)
        await turn()
        sent = wire.sent()
        answer(link, Basic.Ack(1))
        link.pause_writing()  # the socket's buffer is full: the next round waits too
        paused = asyncio.ensure_future(publisher_on(link).publish_many([make_entry(id="z")]))
        await turn()
        sent.append(str(wire.sent()))
        link.resume_writing()
        await turn()
        sent += wire.sent()
        answer(link, Basic.Ack(2))
        return expired, [*await waiting, *await paused], sent

    expired, waited, sent = asyncio.run(rounds())
    assert isinstance(expired[0], BrokerUnavailable) and "timed out" in str(expired[0])
    assert waited == [None, None] and sent == ["y", "[]", "z"]


def test_a_silent_broker_is_a_lost_connection_and_heartbeats_are_sent() -> None:
    """With a heartbeat of 1 s, the link writes heartbeats while idle, keeps a broker
    that answers, and gives up on one silent for two intervals: every entry still
    unconfirmed fails with ``BrokerUnavailable``."""

    async def silence() -> tuple[list[Exception | None], list[bytes], bool, Link]:
        link, wire = open_link(heartbeat=1)
        link._tick()
        sending = asyncio.ensure_future(publisher_on(link).publish_many([make_entry(id="s")]))
        await asyncio.sleep(1.2)
        answer(link, Heartbeat(), channel=0)  # heard: the link keeps going
        kept = link.lost is None
        wire.written = [w for w in wire.written if w == _HEARTBEAT]
        return await sending, wire.written, kept, link

    outcomes, beats, kept, link = asyncio.run(silence())
    assert kept and beats and isinstance(outcomes[0], BrokerUnavailable)
    assert "timed out" in str(outcomes[0])
    assert "no heartbeat from the broker in 2 s" in str(link.lost)
    assert link.transport is not None and link.transport.is_closing()  # aborted


@pytest.mark.rabbitmq
def test_a_rabbitmq_round_confirms_or_refuses_each_entry_on_its_own(url: str, box: Sandbox) -> None:
    exchange, queue = bounded_queue(box, 2)
    direct, routed, _ = box.names()
    box.channel.exchange_declare(direct, "direct", durable=True)
    box.channel.queue_declare(routed, durable=True)
    box.channel.queue_bind(routed, direct, "known")

    async def rounds() -> tuple[list[Exception | None], list[Exception | None]]:
        async with AsyncRabbitPublisher(url, exchange) as publisher:
            assert isinstance(publisher, AsyncPipelinedPublisher)
            full = await publisher.publish_many([make_entry(f"p{i}") for i in range(4)])
        async with AsyncRabbitPublisher(url, direct) as publisher:
            mixed = await publisher.publish_many(
                [make_entry("a", destination=d) for d in ("known", "nobody", "known")]
            )
        return full, mixed

    full, mixed = asyncio.run(rounds())
    assert full[:2] == [None, None]
    assert all(isinstance(o, PublishError) for o in full[2:]), full
    assert [type(o).__name__ for o in mixed] == ["NoneType", "PublishError", "NoneType"]
    assert "312" in str(mixed[1])
    assert len(box.drain(queue)) == 2
    assert len(box.drain(routed)) == 2


@pytest.mark.rabbitmq
def test_two_rounds_with_the_same_entry_id_get_the_return_of_their_own(
    url: str, box: Sandbox
) -> None:
    """The same entry id in two rounds in flight together, the first routed nowhere: the
    broker's return fails the first round's entry only (matched by id, routing key and
    order), and the second is confirmed and delivered."""
    exchange, queue = bounded_queue(box, 100)
    box.channel.queue_unbind(queue, exchange, "#")
    box.channel.queue_bind(queue, exchange, "Event")

    async def rounds() -> list[list[Exception | None]]:
        route = lambda e: str(e.headers["to"])  # noqa: E731
        async with AsyncRabbitPublisher(url, exchange, route=route) as publisher:
            await publisher.publish(make_entry(id="warm", headers={"to": "Event"}))
            return list(
                await asyncio.gather(
                    publisher.publish_many([make_entry(id="same", headers={"to": "nowhere"})]),
                    publisher.publish_many([make_entry(id="same", headers={"to": "Event"})]),
                )
            )

    for _ in range(3):
        first, second = asyncio.run(rounds())
        assert type(first[0]) is PublishError and "unroutable" in str(first[0]), first
        assert second == [None]
        assert [e.id for e in (decode_entry(b) for _, b in box.drain(queue))] == ["warm", "same"]


@pytest.mark.rabbitmq
@pytest.mark.parametrize(
    ("change", "says"),
    [(("guest:guest@", "guest:wrong@"), "403 ACCESS_REFUSED"), (("/%2F", "/no-such"), "530")],
)
def test_refused_credentials_or_virtual_host_fail_the_round_with_the_brokers_reason(
    url: str, change: tuple[str, str], says: str
) -> None:
    """The handshake sends the URL's credentials and virtual host: the broker's refusal
    (``connection.close``) fails every entry with ``BrokerUnavailable`` naming it, the
    password masked."""
    assert change[0] in url
    refused = url.replace(*change)

    async def round_() -> list[Exception | None]:
        async with AsyncRabbitPublisher(refused, "", timeout=10) as publisher:
            return await publisher.publish_many([make_entry(id="a"), make_entry(id="b")])

    outcomes = asyncio.run(round_())
    assert all(type(o) is BrokerUnavailable and says in str(o) for o in outcomes), outcomes
    assert ":wrong@" not in str(outcomes[0])


def self_signed(directory: Path) -> tuple[str, str]:
    """A throwaway certificate for 127.0.0.1 and its key (PEM files in ``directory``)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        missing("openssl is needed to make a test certificate")
    cert, key = directory / "broker.pem", directory / "broker.key"
    subprocess.run(
        [
            str(openssl), "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


async def tls_front(upstream: tuple[str, int], cert: str, key: str) -> asyncio.Server:
    """A TLS endpoint on 127.0.0.1 forwarding to the broker's plain port, as a broker
    with a TLS listener would answer."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)


@pytest.mark.rabbitmq
def test_amqps_urls_publish_over_tls_verified_by_the_urls_cafile(
    url: str, box: Sandbox, tmp_path: Path
) -> None:
    """``amqps://`` publishes over TLS: trusted through the URL's ``cafile``, refused
    (``BrokerUnavailable``, nothing sent) without it, accepted unverified with
    ``no_verify_ssl=1``."""
    exchange, queue = bounded_queue(box, 100)
    cert, key = self_signed(tmp_path)

    async def rounds() -> list[list[Exception | None]]:
        front = await tls_front(broker_address(url), cert, key)
        port = front.sockets[0].getsockname()[1]
        secure = url.replace("amqp://", "amqps://").replace(":5672/", f":{port}/")
        joined = "&" if "?" in secure else "?"
        outcomes = []
        try:
            for query, seq in ((f"cafile={cert}", 1), ("", 2), ("no_verify_ssl=1", 3)):
                target = secure + (joined + query if query else "")
                async with AsyncRabbitPublisher(target, exchange, timeout=10) as publisher:
                    outcomes.append(await publisher.publish_many([make_entry("t", seq)]))
        finally:
            front.close()
        return outcomes

    assert ":5672/" in url
    trusted, refused, unverified = asyncio.run(rounds())
    assert trusted == [None] and unverified == [None]
    assert isinstance(refused[0], BrokerUnavailable), refused
    assert "TLS failed (self-signed certificate)" in str(refused[0])
    assert [decode_entry(body).seq for _, body in box.drain(queue)] == [1, 3]


@pytest.mark.rabbitmq
def test_a_long_round_arrives_in_order_with_bodies_over_frame_max(url: str, box: Sandbox) -> None:
    """One round of 1,500 entries, three of them with bodies of several ``frame_max``
    (131,072 bytes by default): all confirmed, delivered in the round's order, intact."""
    exchange, queue = bounded_queue(box, 10_000)
    entries = [make_entry("long", seq) for seq in range(1, 1501)]
    for seq in (2, 700, 1500):
        entries[seq - 1] = entries[seq - 1].model_copy(
            update={"payload": {"blob": f"{seq}:" + "x" * 400_000}}
        )

    async def round_() -> list[Exception | None]:
        async with AsyncRabbitPublisher(url, exchange) as publisher:
            return await publisher.publish_many(entries)

    assert asyncio.run(round_()) == [None] * 1500
    received = [decode_entry(body) for _, body in box.drain(queue)]
    assert [e.seq for e in received] == list(range(1, 1501))
    assert received == entries


@pytest.mark.rabbitmq
def test_a_routing_key_amqp_cannot_carry_fails_its_entry_only(url: str, box: Sandbox) -> None:
    """A routing key over 255 bytes is refused before anything is sent, as that entry's
    permanent error; the round's other entries go out (aiormq raised ValueError out of
    the whole round). An exchange name over 255 bytes fails every entry so."""
    exchange, queue = bounded_queue(box, 100)
    entries = [make_entry("r", 1), make_entry("r", 2, destination="k" * 256), make_entry("r", 3)]

    async def round_() -> list[Exception | None]:
        async with AsyncRabbitPublisher(url, exchange) as publisher:
            return await publisher.publish_many(entries)

    async def too_long() -> list[Exception | None]:
        async with AsyncRabbitPublisher(url, "x" * 256) as publisher:
            return await publisher.publish_many(entries)

    outcomes = asyncio.run(round_())
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], PermanentPublishError) and "routing key" in str(outcomes[1])
    assert [decode_entry(body).seq for _, body in box.drain(queue)] == [1, 3]
    refused = asyncio.run(too_long())
    assert all(isinstance(o, PermanentPublishError) for o in refused)
    assert "exchange is 256 bytes" in str(refused[0]) and "exchange" in str(refused[2])


@pytest.mark.rabbitmq
def test_heartbeats_keep_the_connection_of_the_rounds_open(url: str, box: Sandbox) -> None:
    """The publishing connection's heartbeats (every second here, from the URL) keep it
    open while the publisher is idle for several heartbeat timeouts: the broker would
    close a connection after two missed beats."""
    exchange, queue = bounded_queue(box, 100)
    beating = url + ("&" if "?" in url else "?") + "heartbeat=1"

    async def rounds() -> tuple[list[Exception | None], list[Exception | None], bool]:
        async with AsyncRabbitPublisher(beating, exchange, probe_idle=3600) as publisher:
            first = await publisher.publish_many([make_entry("h", 1)])
            connection = publisher._link
            assert connection is not None and connection.heartbeat == 1
            await asyncio.sleep(4)  # the broker closes a connection after 2 missed beats
            second = await publisher.publish_many([make_entry("h", 2)])
            return first, second, publisher._link is connection

    first, second, same = asyncio.run(rounds())
    assert first == [None] and second == [None] and same
    assert [decode_entry(body).seq for _, body in box.drain(queue)] == [1, 2]


@pytest.mark.rabbitmq
def test_a_connection_killed_mid_round_fails_every_unconfirmed_entry_and_reconnects(
    url: str, box: Sandbox
) -> None:
    """The connection drops as the broker's first confirm comes back: no entry of the
    round is confirmed, so every one fails with ``BrokerUnavailable``; the next call
    opens a new connection and its round is confirmed."""
    exchange, queue = bounded_queue(box, 10_000)
    with TcpProxy(broker_address(url)) as proxy:

        async def rounds() -> tuple[list[Exception | None], list[Exception | None]]:
            async with AsyncRabbitPublisher(through(url, proxy.port), exchange) as publisher:
                await publisher.publish(make_entry("warm"))  # connected, channel open
                proxy.drop_next_reply()
                lost = await publisher.publish_many([make_entry("k", s) for s in range(1, 201)])
                again = await publisher.publish_many([make_entry("n", s) for s in range(1, 6)])
                return lost, again

        lost, again = asyncio.run(rounds())
    assert all(isinstance(o, BrokerUnavailable) for o in lost), lost
    assert again == [None] * 5
    seqs = [decode_entry(body) for _, body in box.drain(queue)]
    assert [e.seq for e in seqs if e.aggregate_id == "n"] == [1, 2, 3, 4, 5]


@pytest.mark.rabbitmq
def test_a_round_to_a_deleted_exchange_fails_and_the_next_round_reopens(
    url: str, box: Sandbox
) -> None:
    """The broker closes the channel (404) on the round's first entry: every entry fails
    with the permanent error, and once the exchange is back the next round uses a new
    channel."""
    exchange, queue = bounded_queue(box, 10_000)

    async def rounds() -> tuple[list[Exception | None], list[Exception | None]]:
        async with AsyncRabbitPublisher(url, exchange) as publisher:
            await publisher.publish(make_entry("warm"))
            box.channel.exchange_delete(exchange)
            gone = await publisher.publish_many([make_entry("g", s) for s in range(1, 51)])
            box.channel.exchange_declare(exchange, "topic", durable=True)
            box.channel.queue_bind(queue, exchange, "#")
            back = await publisher.publish_many([make_entry("b", s) for s in range(1, 4)])
            return gone, back

    gone, back = asyncio.run(rounds())
    assert all(type(o) is PermanentPublishError and "404" in str(o) for o in gone), gone
    assert back == [None] * 3
    assert len(box.drain(queue)) == 4


@pytest.mark.rabbitmq
def test_the_threaded_pipelined_publisher_serves_many_threads_and_reopens_after_close(
    url: str, box: Sandbox
) -> None:
    exchange, queue = bounded_queue(box, 100)
    publisher = PipelinedRabbitPublisher(url, exchange)
    outcomes: list[list[Exception | None]] = []

    def work(worker: int) -> None:
        outcomes.append(publisher.publish_many([make_entry(f"w{worker}-{i}") for i in range(5)]))

    workers = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    publisher.close()
    publisher.publish(make_entry("after-close"))  # a new loop and connection
    publisher.close()
    assert outcomes == [[None] * 5] * 4
    assert len(box.drain(queue)) == 21


@pytest.mark.rabbitmq
def test_concurrent_rounds_never_lose_their_channel_to_the_idle_probe(
    url: str, box: Sandbox
) -> None:
    """A round in flight keeps its channel: the idle probe (every call, here) must not
    close it under the confirms of another round, nor drop the connection another call
    is opening."""
    exchange, queue = bounded_queue(box, 1000)

    async def rounds() -> list[list[Exception | None]]:
        async with AsyncRabbitPublisher(url, exchange, probe_idle=0.0) as publisher:
            return list(
                await asyncio.gather(
                    *(
                        publisher.publish_many([make_entry(f"r{r}-{i}") for i in range(40)])
                        for r in range(6)
                    )
                )
            )

    outcomes = asyncio.run(rounds())
    assert outcomes == [[None] * 40] * 6
    assert len(box.drain(queue)) == 240


class Counting:
    """Counts what a publisher's rounds refused."""

    def __init__(self) -> None:
        self.refused = 0
        self.rounds: list[int] = []

    def count(self, outcomes: list[Exception | None]) -> list[Exception | None]:
        self.rounds.append(len(outcomes))
        self.refused += sum(isinstance(o, PublishError) for o in outcomes)
        return outcomes


class CountingRabbit(AsyncRabbitPublisher):
    def __init__(self, *args: Any, counts: Counting, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = counts

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        return self.counts.count(await super().publish_many(entries))


class CountingThreadedRabbit(PipelinedRabbitPublisher):
    def __init__(self, *args: Any, counts: Counting, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = counts

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        return self.counts.count(super().publish_many(entries))


def run_async_dispatcher(url: str, exchange: str, backend: MemoryBackend, counts: Counting) -> None:
    publisher = CountingRabbit(url, exchange, counts=counts)

    async def dispatch() -> None:
        dispatcher = AsyncDispatcher(
            AsyncMemoryBackend(backend),
            publisher,
            in_thread(MemoryDeadLetters()),
            config=config(),
        )
        assert dispatcher.ports.pipelined
        task = asyncio.create_task(dispatcher.run())
        await asyncio.to_thread(wait_until_trimmed, backend)
        dispatcher.stop()
        await task
        await publisher.close()

    asyncio.run(dispatch())


def run_threaded_dispatcher(
    url: str, exchange: str, backend: MemoryBackend, counts: Counting
) -> None:
    with CountingThreadedRabbit(url, exchange, counts=counts) as publisher:
        assert isinstance(publisher, PipelinedPublisher)
        dispatcher = Dispatcher(backend, publisher, MemoryDeadLetters(), config=config())
        assert dispatcher.ports.pipelined
        runner = threading.Thread(target=dispatcher.run)
        runner.start()
        try:
            wait_until_trimmed(backend)
        finally:
            dispatcher.stop()
            runner.join()


@pytest.mark.rabbitmq
@pytest.mark.parametrize("driver", ["asyncio", "threads"])
def test_dispatcher_to_rabbitmq_keeps_order_and_loses_nothing_under_nacks(
    url: str, box: Sandbox, driver: str
) -> None:

    exchange, queue = bounded_queue(box, 5)
    backend = pending_backend(AGGREGATES, PER_AGGREGATE)
    received: list[OutboxMessage] = []
    done = threading.Event()

    def drain() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = connection.channel()
            while not done.is_set():
                method, _, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    time.sleep(0.03)  # let the queue fill up: the broker refuses the rest
                else:
                    received.append(decode_entry(body))
        finally:
            connection.close()

    drainer = threading.Thread(target=drain)
    drainer.start()
    counts = Counting()
    run = run_async_dispatcher if driver == "asyncio" else run_threaded_dispatcher
    try:
        run(url, exchange, backend, counts)
        deadline = time.monotonic() + 10
        while len({e.id for e in received}) < AGGREGATES * PER_AGGREGATE:
            assert time.monotonic() < deadline, "entries confirmed but not received"
            time.sleep(0.02)
    finally:
        done.set()
        drainer.join()
    assert counts.refused > 0, "the bounded queue never refused anything"
    assert max(counts.rounds) > 1
    firsts = first_deliveries_in_order(received)
    expected = list(range(1, PER_AGGREGATE + 1))
    assert firsts == {f"agg-{a:02d}": expected for a in range(AGGREGATES)}


# -- Kafka (confluent-kafka) -------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_kafka_round_reports_each_record_on_its_own(
    kafka: str, topics: Topics, flavour: str
) -> None:
    topic = topics.create()
    settings = {"bootstrap.servers": kafka, "message.max.bytes": 2000}
    entries = [make_entry("a"), make_entry("b", headers={"blob": "x" * 3000}), make_entry("c")]
    if flavour == "sync":
        with KafkaPublisher(settings, topic) as publisher:
            assert isinstance(publisher, PipelinedPublisher)
            outcomes = publisher.publish_many(entries)
    else:

        async def run() -> list[Exception | None]:
            async with AsyncKafkaPublisher(settings, topic) as publisher:
                assert isinstance(publisher, AsyncPipelinedPublisher)
                return await publisher.publish_many(entries)

        outcomes = asyncio.run(run())
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], PermanentPublishError)
    assert "MSG_SIZE_TOO_LARGE" in str(outcomes[1])
    assert topics.size(topic) == 2


@pytest.fixture
def proxy(kafka: str) -> Iterator[TcpProxy]:
    """A proxy on the port the broker's PROXIED listener advertises."""
    listener, advertised = proxied_ports()
    with TcpProxy(("127.0.0.1", listener), port=advertised) as created:
        yield created


class CuttingKafka(KafkaPublisher):
    """Cuts the connection a few milliseconds into each of its first ``cuts`` rounds, with
    the round's records in flight."""

    def __init__(self, *args: Any, proxy: TcpProxy, cuts: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proxy = proxy
        self.cuts = cuts
        self.rounds: list[int] = []

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        self.rounds.append(len(entries))
        if self.cuts and len(entries) > 1:
            self.cuts -= 1
            threading.Timer(0.005, self.proxy.cut).start()
        return super().publish_many(entries)


@pytest.mark.kafka
def test_dispatcher_to_kafka_keeps_order_and_loses_nothing_while_connections_drop(
    kafka: str, topics: Topics, proxy: TcpProxy
) -> None:
    topic = topics.create(partitions=2)
    settings = {
        "bootstrap.servers": f"127.0.0.1:{proxy.port}",
        "message.timeout.ms": 15000,
        "reconnect.backoff.max.ms": 200,
    }
    backend = pending_backend(AGGREGATES, PER_AGGREGATE)
    publisher = CuttingKafka(settings, topic, proxy=proxy, cuts=6)
    dispatcher = Dispatcher(backend, publisher, MemoryDeadLetters(), config=config())
    assert dispatcher.ports.pipelined
    runner = threading.Thread(target=dispatcher.run)
    runner.start()
    try:
        wait_until_trimmed(backend)
    finally:
        dispatcher.stop()
        runner.join()
        publisher.close()
    assert publisher.cuts == 0 and max(publisher.rounds) > 1
    count = topics.size(topic)
    assert count >= AGGREGATES * PER_AGGREGATE
    received = [decode_entry(r.value()) for r in topics.read(topic, count)]
    firsts = first_deliveries_in_order(received)
    expected = list(range(1, PER_AGGREGATE + 1))
    assert firsts == {f"agg-{a:02d}": expected for a in range(AGGREGATES)}
