"""Publish rounds on the real brokers: every entry of a round is in flight before the first
confirm, each gets its own outcome, and a dispatcher keeps per-aggregate first-delivery
order (I4) and loses nothing while the broker refuses entries in the middle of rounds.

RabbitMQ runs on aio-pika: ``AsyncRabbitPublisher`` for the asyncio dispatcher, and
``PipelinedRabbitPublisher`` (the same on a loop thread of its own) for the threaded one.
RabbitMQ faults: a queue of ``x-max-length`` with ``x-overflow: reject-publish`` (the
broker nacks what does not fit) and an unroutable ``mandatory`` publish (returned).
Kafka faults: a record over ``message.max.bytes`` in the middle of a round, and a proxy
that cuts the connection while rounds are in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import aiormq.exceptions as ax
import pamqp.frame
import pika
import pytest
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from benchmarks.ledger import make_entry
from benchmarks.rabbit import Sandbox
from benchmarks.servers import Topics
from docoutbox.codec import decode_entry
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.errors import BrokerUnavailable, InvalidConfig, PermanentPublishError, PublishError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import AsyncPipelinedPublisher, PipelinedPublisher
from docoutbox.store.document import partition_of, utcnow
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_kafka import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.pipelined import PipelinedRabbitPublisher
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


# -- RabbitMQ (aio-pika) -----------------------------------------------------------------


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


class _FakeChannel:
    """aiormq's confirm-mode channel as a round uses it, with no broker: the test reads
    what was written and settles the slots itself."""

    number = 1
    max_content_size = 131_064

    def __init__(self) -> None:
        self.delivery_tag = 0
        self.confirmations: dict[int, Any] = {}
        self.message_id_delivery_tag: dict[str, int] = {}
        self.write_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closing: list[asyncio.Future[Any]] = []
        self._lock = asyncio.Lock()

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    def create_future(self) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.closing.append(future)
        return future

    async def get_underlay_channel(self) -> _FakeChannel:
        return self

    async def sent(self) -> list[str]:
        """The message ids of the next write, in order (one write per round)."""
        payload = (await self.write_queue.get()).payload
        ids = []
        while payload:
            used, _, frame = pamqp.frame.unmarshal(payload)
            payload = payload[used:]
            if isinstance(frame, ContentHeader):
                ids.append(frame.properties.message_id)
        return ids


def publisher_on(channel: _FakeChannel, timeout: float = 30.0) -> AsyncRabbitPublisher:
    publisher = AsyncRabbitPublisher("amqp://guest:guest@127.0.0.1:1/", "ex", timeout=timeout)

    async def opened() -> Any:
        return channel

    publisher._open = opened  # type: ignore[method-assign]
    return publisher


def test_a_rabbitmq_round_has_one_deadline_and_fails_only_what_it_did_not_confirm() -> None:
    """The asyncio publisher bounds a whole round by ``timeout``: an entry still
    unconfirmed then fails with ``BrokerUnavailable``, and its late confirm is ignored;
    the others keep their own outcomes, in order."""
    channel = _FakeChannel()

    async def round_() -> tuple[list[Exception | None], list[str]]:
        publisher = publisher_on(channel, timeout=0.05)
        entries = [make_entry(id=i) for i in ("a", "b", "c")]
        sending = asyncio.ensure_future(publisher.publish_many(entries))
        sent = await channel.sent()
        channel.confirmations[1].set_result(None)
        channel.confirmations[3].set_result(None)
        outcomes = await sending
        late = channel.confirmations[2]
        assert late.done()  # aiormq ignores a late confirm of a settled slot
        return outcomes, sent

    outcomes, sent = asyncio.run(round_())
    assert sent == ["a", "b", "c"]
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], BrokerUnavailable)
    assert "publish entry b " in str(outcomes[1]) and "timed out" in str(outcomes[1])
    assert "127.0.0.1:1" in str(outcomes[1])
    assert channel.message_id_delivery_tag == {}


class _OtherAiormqChannel(_FakeChannel):
    """A channel of an aiormq release whose confirms live elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        del self.confirmations


def test_a_round_refuses_a_channel_it_cannot_settle_and_writes_nothing() -> None:
    """Rounds use parts of aiormq's channel that are not its public API: on a channel
    without them every entry fails with ``InvalidConfig`` and nothing is sent."""
    channel = _OtherAiormqChannel()

    async def round_() -> list[Exception | None]:
        return await publisher_on(channel).publish_many([make_entry(id="a"), make_entry(id="b")])

    outcomes = asyncio.run(round_())
    assert all(isinstance(outcome, InvalidConfig) for outcome in outcomes)
    assert "confirmations" in str(outcomes[0])
    assert channel.write_queue.empty()


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (ax.ChannelNotFoundEntity("NOT_FOUND - no exchange 'ex'"), PermanentPublishError),
        (ax.AMQPConnectionError("connection lost"), BrokerUnavailable),
        (Exception, BrokerUnavailable),  # aiormq's close without a reason
    ],
)
def test_a_channel_closing_mid_round_fails_only_the_unconfirmed_entries(
    reason: BaseException | type[BaseException], expected: type[Exception]
) -> None:
    """A nack, a return, an ack, then the channel closes: each entry keeps what the broker
    said, and the unconfirmed ones take the close reason, translated."""
    channel = _FakeChannel()

    async def round_() -> list[Exception | None]:
        publisher = publisher_on(channel)
        sending = asyncio.ensure_future(
            publisher.publish_many([make_entry(id=f"e{i}") for i in range(6)])
        )
        await channel.sent()
        channel.confirmations[1].set_result(None)
        channel.confirmations[2].set_exception(ax.DeliveryError(None, Basic.Nack(2)))
        returned = Basic.Return(312, "NO_ROUTE", "ex", "k")
        channel.confirmations[3].set_exception(ax.DeliveryError(None, returned))
        channel.confirmations[4].set_result(None)
        for future in channel.closing:
            future.set_exception(reason)
        return await sending

    outcomes = asyncio.run(round_())
    assert outcomes[0] is None and outcomes[3] is None
    assert type(outcomes[1]) is PublishError and "nack" in str(outcomes[1]).lower()
    assert type(outcomes[2]) is PublishError and "312" in str(outcomes[2])
    assert all(type(o) is expected for o in outcomes[4:]), outcomes


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
    """Rounds write on aiormq's connection, whose heartbeats (every second here) keep it
    open while the publisher is idle for several heartbeat timeouts."""
    exchange, queue = bounded_queue(box, 100)
    beating = url + ("&" if "?" in url else "?") + "heartbeat=1"

    async def rounds() -> tuple[list[Exception | None], list[Exception | None], bool]:
        async with AsyncRabbitPublisher(beating, exchange, probe_idle=3600) as publisher:
            first = await publisher.publish_many([make_entry("h", 1)])
            connection = publisher._connection
            await asyncio.sleep(4)  # the broker closes a connection after 2 missed beats
            second = await publisher.publish_many([make_entry("h", 2)])
            return first, second, publisher._connection is connection

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
