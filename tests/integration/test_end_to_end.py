"""Producers → outbox → dispatcher (change stream) → broker → consumer inbox, end to end.

Twenty producer aggregates commit commands on the wire server, each emitting three
messages. The real dispatcher engine follows the collection's change stream and publishes
to one queue (:class:`~docoutbox_rabbitmq.RabbitPublisher` and
:class:`~docoutbox_rabbitmq.RabbitConsumer`) or one four-partition topic
(:class:`~docoutbox_kafka.KafkaPublisher` and :class:`~docoutbox_kafka.KafkaConsumer`);
the consumer applies them to ledgers, one per producer, with exact de-duplication. Each
ledger records the seqs it applied, in order.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from benchmarks.ledger import Ledger
from benchmarks.rabbit import Sandbox
from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.testing.contract import Counter
from docoutbox_kafka import KafkaPublisher
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.kit import open_async_kit, open_kit
from docoutbox_rabbitmq import RabbitPublisher
from tests.support.e2e import broker_address, through
from tests.support.kafka import proxied_ports
from tests.support.tcpproxy import TcpProxy
from tests.support.traffic import (
    RECEIVER_CONFIG,
    KafkaReceiver,
    Producers,
    Receiver,
    ledger_problems,
    republished,
    summary,
)

pytestmark = pytest.mark.wire

PRODUCERS = 20
COMMANDS = 10  # per producer, before and again after the dispatcher starts
EMITS = 3


class Broker:
    """One broker's publisher, receiver and fault-injecting proxy for the pipeline."""

    name: str

    def publisher(self, proxy: TcpProxy | None) -> Any: ...

    def receiver(self, store: AggregateStore[Ledger]) -> Receiver: ...

    def proxy(self) -> TcpProxy: ...


class Rabbit(Broker):
    name = "rabbitmq"

    def __init__(self, box: Sandbox) -> None:
        self.box = box
        self.exchange, self.queue, _ = box.names()
        with RabbitPublisher(box.url, self.exchange) as setup:
            setup.declare(queues={self.queue: ["#"]})

    def publisher(self, proxy: TcpProxy | None) -> Any:
        url = self.box.url if proxy is None else through(self.box.url, proxy.port)
        return RabbitPublisher(url, self.exchange)

    def receiver(self, store: AggregateStore[Ledger]) -> Receiver:
        return Receiver(self.box.url, self.queue, store)

    def proxy(self) -> TcpProxy:
        return TcpProxy(broker_address(self.box.url))


class Kafka(Broker):
    name = "kafka"

    def __init__(self, topics: Any) -> None:
        self.topics = topics
        self.topic = topics.create(partitions=4)
        self.dead = topics.create("dx-dead")

    def publisher(self, proxy: TcpProxy | None) -> Any:
        bootstrap = self.topics.bootstrap if proxy is None else f"127.0.0.1:{proxy.port}"
        return KafkaPublisher({"bootstrap.servers": bootstrap}, self.topic)

    def receiver(self, store: AggregateStore[Ledger]) -> Receiver:
        return KafkaReceiver(
            self.topics.bootstrap, self.topic, store, group=self.topic, dead_letters=self.dead
        )

    def proxy(self) -> TcpProxy:
        listener, advertised = proxied_ports()
        return TcpProxy(("127.0.0.1", listener), port=advertised)


@pytest.fixture(params=["rabbitmq", "kafka"])
def broker(request: pytest.FixtureRequest) -> Broker:
    if request.param == "rabbitmq":
        request.applymarker(pytest.mark.rabbitmq)
        return Rabbit(request.getfixturevalue("box"))
    request.applymarker(pytest.mark.kafka)
    return Kafka(request.getfixturevalue("topics"))


class Pipeline:
    """Producers, the dispatcher engine on a thread, and a receiver, over one queue or topic."""

    def __init__(
        self,
        mongo_uri: str,
        mongo: Any,
        broker: Broker,
        proxy: TcpProxy | None = None,
        driver: str = "threaded",
    ) -> None:
        self.mongo = mongo
        self.producers = Producers(
            AggregateStore(MongoBackend(mongo["producers"]), Counter),
            [f"p{i:02d}" for i in range(PRODUCERS)],
            random.Random(1),
            emits=EMITS,
        )
        ledgers = AggregateStore(MongoBackend(mongo["ledgers"]), Ledger, RECEIVER_CONFIG)
        self.receiver = broker.receiver(ledgers)
        self.target = open_kit(mongo_uri, mongo.name, "producers")
        self.publisher = broker.publisher(proxy)
        config = DispatcherConfig(name="e2e", concurrency=4, policy=DispatchPolicy())
        self.dispatcher: Dispatcher | AsyncDispatcher
        if driver == "async":
            self.dispatcher = self._async_dispatcher(mongo_uri, mongo.name, config)
            return
        self.dispatcher = Dispatcher(
            self.target.backend,
            self.publisher,
            self.target.dead_letters,
            source=self.target.source,
            checkpoints=self.target.checkpoints,
            config=config,
        )
        self._thread = threading.Thread(target=self.dispatcher.run, daemon=True)

    def _async_dispatcher(self, uri: str, db: str, config: DispatcherConfig) -> AsyncDispatcher:
        """The asyncio dispatcher on ``AsyncMongoClient``, the pika publisher in threads."""
        made: list[AsyncDispatcher] = []
        ready = threading.Event()
        self._go = threading.Event()

        async def main() -> None:
            ports = await open_async_kit(uri, db, "producers")
            made.append(
                AsyncDispatcher(
                    ports.backend,
                    in_thread(self.publisher),
                    ports.dead_letters,
                    source=ports.source,
                    checkpoints=ports.checkpoints,
                    config=config,
                )
            )
            ready.set()
            try:
                await asyncio.to_thread(self._go.wait)  # until start()
                await made[0].run()
            finally:
                await ports.close()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        assert ready.wait(30)
        return made[0]

    def start(self) -> None:
        self.receiver.start()
        if self._thread.is_alive():
            self._go.set()
        else:
            self._thread.start()
        assert self.dispatcher.started.wait(30)

    def drain(self, timeout: float = 90) -> tuple[dict[str, int], dict[str, list[int]]]:
        expected = self.producers.expected()
        pending = self.producers.pending
        applied = self.receiver.wait_for(expected, timeout=timeout, also=lambda: not pending())
        return expected, applied

    def stop(self) -> None:
        self.dispatcher.stop()
        self._thread.join(timeout=30)
        self.publisher.close()
        self.target.close()
        self.receiver.stop()

    def check(self, expected: dict[str, int], applied: dict[str, list[int]]) -> None:
        """Exactly once, none lost, in seq order; everything trimmed, nothing quarantined."""
        assert sum(expected.values()) == PRODUCERS * COMMANDS * EMITS
        assert len(expected) == PRODUCERS
        assert ledger_problems(applied, expected) == {}
        assert self.producers.pending() == {}
        assert self.mongo["docoutbox_dead_letters"].count_documents({}) == 0
        # Delivery order on the one queue: per source, first deliveries come in seq order.
        firsts: dict[str, list[int]] = {}
        for delivery in self.receiver.deliveries:
            if not delivery.duplicate and delivery.source and delivery.seq is not None:
                firsts.setdefault(delivery.source, []).append(delivery.seq)
        assert firsts == applied
        assert all(d.action == "ack" for d in self.receiver.deliveries)


@pytest.fixture(params=["threaded", "async"])
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_message_is_processed_exactly_once_in_order(
    mongo_uri: str, mongo: Any, broker: Broker, driver: str
) -> None:
    pipeline = Pipeline(mongo_uri, mongo, broker, driver=driver)
    started = time.monotonic()
    try:
        pipeline.producers.run_commands(COMMANDS // 2)  # pending before the start: the sweep
        pipeline.start()
        pipeline.producers.run_commands(COMMANDS // 2)  # committed while it follows the stream
        expected, applied = pipeline.drain()
    finally:
        pipeline.stop()
    pipeline.check(expected, applied)
    again = republished(pipeline.receiver.deliveries)
    print(
        f"\nend-to-end ({broker.name}, {driver}):",
        summary(
            {
                "producers": PRODUCERS,
                "commands": pipeline.producers.commands,
                "messages": sum(expected.values()),
                "deliveries": len(pipeline.receiver.deliveries),
                "republished": sum(again.values()),
                "seconds": round(time.monotonic() - started, 2),
            }
        ),
    )
    assert again == {}  # without crashes, nothing is published twice


def test_a_broker_outage_holds_entries_and_loses_nothing(
    mongo_uri: str, mongo: Any, broker: Broker, driver: str
) -> None:
    with broker.proxy() as proxy:
        pipeline = Pipeline(mongo_uri, mongo, broker, proxy, driver)
        try:
            pipeline.start()
            pipeline.producers.run_commands(COMMANDS // 2)
            proxy.refuse = True  # the broker goes away mid-stream ...
            proxy.cut()
            pipeline.producers.run_commands(COMMANDS // 2)
            time.sleep(1.5)
            held = sum(len(ids) for ids in pipeline.producers.pending().values())
            proxy.refuse = False  # ... and comes back
            expected, applied = pipeline.drain()
        finally:
            pipeline.stop()
    pipeline.check(expected, applied)  # nothing quarantined: unavailability is no one's fault
    assert held > 0
    again = republished(pipeline.receiver.deliveries)
    print(f"\nbroker outage ({broker.name}): held={held} republished={sum(again.values())}")
    # Only an entry in flight when the connection was cut (sent, never confirmed) can be
    # published again, each at most once. A publisher that pipelines confirms (aio-pika,
    # Kafka) has one entry per aggregate of a worker's publish round in flight; one that
    # does not (pika), one entry per worker.
    config = pipeline.dispatcher.config
    pipelined = (driver == "async" and broker.name == "rabbitmq") or broker.name == "kafka"
    in_flight = config.concurrency * (config.run_batch if pipelined else 1)
    assert sum(again.values()) <= in_flight, again
    assert all(count == 1 for count in again.values()), again
