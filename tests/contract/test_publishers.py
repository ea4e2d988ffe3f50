"""Every real publisher runs the publisher contract on its real broker:
:class:`~docoutbox.testing.dispatch_contract.BrokerPublisherContract` (accepted entries
are received in order; an unknown destination is refused and the publisher keeps working;
an unreachable broker raises ``BrokerUnavailable``)
for RabbitMQ (pika and aio-pika), Kafka (sync and asyncio) and the local publisher (sync
and async, into an aggregate of a memory store).

Each class only builds its publisher and the read-back ``received()``: the broker's own
record of what it accepted (a queue drained with ``basic_get``, a topic read from its first
offset, the receiving aggregate's state). Entries with the destination ``"d"`` go there;
any other destination is one the broker does not know.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from pydantic import Field

from docoutbox import AggregateStore, AsyncAggregateStore, Message
from docoutbox.dispatch.extras.local import AsyncLocalPublisher, LocalPublisher, Route
from docoutbox.errors import TransientStoreError
from docoutbox.handlers import Decision, Handlers
from docoutbox.model import Aggregate, OutboxMessage
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.blocking import BlockingStore
from docoutbox.testing.dispatch_contract import BrokerPublisherContract
from docoutbox_kafka.publisher import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_rabbitmq import RabbitPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.amqp import declare
from tests.support.aio import Blocking


def closed_port() -> int:
    """A local TCP port where nothing listens (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# -- RabbitMQ ----------------------------------------------------------------------------


@pytest.fixture(params=["pika", "aio-pika"])
def rabbit_publisher(request: pytest.FixtureRequest, box: Any) -> Iterator[tuple[Any, Any]]:
    """A publisher to a private direct exchange whose queue is bound to ``"d"``."""

    exchange, queue, _ = box.names()
    declare(box.channel, exchange, exchange_type="direct", queues={queue: ["d"]})
    port: Any = (
        RabbitPublisher(box.url, exchange)
        if request.param == "pika"
        else Blocking(AsyncRabbitPublisher(box.url, exchange))
    )
    seen: list[str] = []

    def received() -> list[str]:
        seen.extend(str(props.message_id) for props, _ in box.drain(queue))
        return list(seen)

    yield port, received
    port.close()


@pytest.fixture
def unreachable_rabbit(rabbit_publisher: tuple[Any, Any]) -> Iterator[Any]:
    """A publisher of the same client to a port where no broker listens."""

    url = f"amqp://guest:guest@127.0.0.1:{closed_port()}/"
    port: Any = (
        RabbitPublisher(url)
        if isinstance(rabbit_publisher[0], RabbitPublisher)
        else Blocking(AsyncRabbitPublisher(url, timeout=5))
    )
    yield port
    port.close()


@pytest.mark.rabbitmq
class TestRabbitPublishers(BrokerPublisherContract):
    @pytest.fixture
    def publisher(self, rabbit_publisher: tuple[Any, Any]) -> tuple[Any, Any]:
        return rabbit_publisher

    @pytest.fixture
    def unreachable_publisher(self, unreachable_rabbit: Any) -> Any:
        return unreachable_rabbit


# -- Kafka -------------------------------------------------------------------------------


class TopicReader:
    """The IDs of a topic's records so far, read from its first offset."""

    def __init__(self, bootstrap: str, topic: str) -> None:

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"dx-contract-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.seen: list[str] = []

    def __call__(self) -> list[str]:
        while (record := self.consumer.poll(0.1)) is not None:
            assert record.error() is None, record.error()
            headers = dict(record.headers() or [])
            self.seen.append(headers["id"].decode())
        return list(self.seen)

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture(params=["sync", "asyncio"])
def kafka_publisher(
    request: pytest.FixtureRequest, kafka: str, topics: Any
) -> Iterator[tuple[Any, Any]]:
    """A publisher routing ``"d"`` to a private one-partition topic, and any other
    destination to the topic of that name (missing: the broker has no such topic)."""

    topic = topics.create("dx-contract")

    def route(entry: OutboxMessage) -> str:
        return topic if entry.destination == "d" else str(entry.destination)

    config = {"bootstrap.servers": kafka}
    port: Any = (
        KafkaPublisher(config, route=route)
        if request.param == "sync"
        else Blocking(AsyncKafkaPublisher(config, route=route))
    )
    reader = TopicReader(kafka, topic)
    yield port, reader
    port.close()
    reader.close()


@pytest.fixture
def unreachable_kafka(kafka_publisher: tuple[Any, Any]) -> Iterator[Any]:
    """A publisher of the same kind bootstrapping from a port where no broker listens; its
    records time out after two seconds instead of thirty."""

    config = {"bootstrap.servers": f"127.0.0.1:{closed_port()}", "message.timeout.ms": 2000}
    port: Any = (
        KafkaPublisher(config, "t")
        if isinstance(kafka_publisher[0], KafkaPublisher)
        else Blocking(AsyncKafkaPublisher(config, "t"))
    )
    yield port
    port.close()


@pytest.mark.kafka
class TestKafkaPublishers(BrokerPublisherContract):
    @pytest.fixture
    def publisher(self, kafka_publisher: tuple[Any, Any]) -> tuple[Any, Any]:
        return kafka_publisher

    @pytest.fixture
    def unreachable_publisher(self, unreachable_kafka: Any) -> Any:
        return unreachable_kafka


# -- The local publisher -----------------------------------------------------------------


class Inbox(Aggregate):
    ids: list[str] = Field(default_factory=list)


inbox_handlers: Handlers[Inbox] = Handlers()


@inbox_handlers.on("Added")
def received_one(state: Inbox, message: Message) -> Decision[Inbox]:
    return Decision(Inbox(ids=[*state.ids, message.id]))


@pytest.fixture(params=["sync", "async"])
def local_publisher(
    request: pytest.FixtureRequest, event_loop_: asyncio.AbstractEventLoop
) -> tuple[Any, Any]:
    """A local publisher whose one route, ``"d"``, hands every entry to one receiver."""
    backend = MemoryBackend()
    receiver = AggregateStore(backend, Inbox)
    port: Any
    if request.param == "sync":
        route = Route(receiver, inbox_handlers, aggregate_id=lambda _: "r", create=True)
        port = LocalPublisher({"d": route})
    else:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Inbox)
        route = Route(store, inbox_handlers, aggregate_id=lambda _: "r", create=True)
        port = BlockingStore(AsyncLocalPublisher({"d": route}), event_loop_)

    def received() -> list[str]:
        snapshot = receiver.load("r")
        return [] if snapshot is None else list(snapshot.state.ids)

    return port, received


class Away(MemoryBackend):
    """A receiving store that cannot be reached: every read and write times out."""

    def load(self, aggregate_id: Any) -> Any:
        raise TransientStoreError("the receiving store timed out")

    def write(self, plan: Any) -> bool:
        raise TransientStoreError("the receiving store timed out")


@pytest.fixture
def unreachable_local(
    local_publisher: tuple[Any, Any], event_loop_: asyncio.AbstractEventLoop
) -> Any:
    """A local publisher of the same kind whose receiving store is away."""
    if isinstance(local_publisher[0], LocalPublisher):
        route = Route(AggregateStore(Away(), Inbox), inbox_handlers, aggregate_id=lambda _: "r")
        return LocalPublisher({"d": route})
    store = AsyncAggregateStore(AsyncMemoryBackend(Away()), Inbox)
    aroute = Route(store, inbox_handlers, aggregate_id=lambda _: "r")
    return BlockingStore(AsyncLocalPublisher({"d": aroute}), event_loop_)


class TestLocalPublishers(BrokerPublisherContract):
    @pytest.fixture
    def publisher(self, local_publisher: tuple[Any, Any]) -> tuple[Any, Any]:
        return local_publisher

    @pytest.fixture
    def unreachable_publisher(self, unreachable_local: Any) -> Any:
        return unreachable_local
