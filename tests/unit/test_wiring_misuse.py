"""Handlers, publishers and consumers built from wrong arguments: ``InvalidConfig`` at
once (no server needed), never an IndexError or TypeError from a driver, nor a setting
accepted only to fail at the first publish."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox import AggregateStore, Handlers, Message
from docoutbox.errors import InvalidConfig
from docoutbox.testing import MemoryBackend
from docoutbox.testing.contract import Counter, counter_handlers

pytest.importorskip("pika")
pytest.importorskip("aio_pika")
pytest.importorskip("confluent_kafka")

from docoutbox_kafka import KafkaConsumer, KafkaPublisher
from docoutbox_rabbitmq import RabbitConsumer, RabbitPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher

BAD_URLS = [
    pytest.param(None, id="none"),  # TypeError from pika
    pytest.param("not a url", id="no-scheme"),  # IndexError from pika
    pytest.param("http://host/", id="http"),
    pytest.param("amqp://u:p@host:port/", id="bad-port"),
]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("publisher", [RabbitPublisher, AsyncRabbitPublisher])
def test_a_rabbitmq_publisher_refuses_a_url_it_cannot_use(publisher: Any, url: Any) -> None:
    with pytest.raises(InvalidConfig, match="URL"):
        publisher(url, "orders")


def test_pika_parameters_pika_refuses_are_invalid_config() -> None:
    with pytest.raises(InvalidConfig, match="bogus_option"):
        RabbitPublisher("amqp://host/?bogus_option=1", "orders")


def test_a_rabbitmq_publisher_keeps_a_good_url() -> None:
    url = "amqp://guest:guest@localhost:5672/%2F?heartbeat=30"
    assert "guest:***@" in repr(RabbitPublisher(url, "orders"))
    assert "guest:***@" in repr(AsyncRabbitPublisher(url, "orders"))


def test_a_rabbitmq_publisher_refuses_an_exchange_that_is_not_text() -> None:
    with pytest.raises(InvalidConfig, match="exchange"):
        RabbitPublisher("amqp://localhost/", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_rabbitmq_consumer_refuses_a_url_it_cannot_use(url: Any) -> None:
    store = AggregateStore(MemoryBackend(), Counter)
    with pytest.raises(InvalidConfig, match="URL"):
        RabbitConsumer(url, "q", store, counter_handlers, aggregate_id_of=lambda m: "c")


@pytest.mark.parametrize("config", [None, "", "  ", 9092, ["localhost:9092"]])
def test_kafka_clients_refuse_bootstrap_servers_they_cannot_use(config: Any) -> None:
    with pytest.raises(InvalidConfig, match="Kafka"):
        KafkaPublisher(config, "orders")

    store = AggregateStore(MemoryBackend(), Counter)
    with pytest.raises(InvalidConfig, match="Kafka"):
        KafkaConsumer(
            config,
            "orders",
            "group",
            store,
            counter_handlers,
            aggregate_id_of=lambda m: "c",
            dead_letter_topic="dead",
        )


def test_kafka_publisher_keeps_a_mapping_of_settings() -> None:
    publisher = KafkaPublisher({"bootstrap.servers": "localhost:9092"}, "orders")
    assert "localhost:9092" in repr(publisher)


@pytest.mark.parametrize(
    "types",
    [
        pytest.param((), id="none"),  # registered nothing, silently
        pytest.param((5,), id="int"),
        pytest.param(("",), id="empty"),
        pytest.param((None,), id="None"),
    ],
)
def test_handlers_on_refuses_message_types_that_are_not_names(types: tuple[Any, ...]) -> None:
    with pytest.raises(InvalidConfig, match="message type"):
        Handlers[Counter]().on(*types)


def test_handlers_refuse_a_second_handler_for_a_type_and_keep_the_first() -> None:
    handlers: Handlers[Counter] = Handlers()

    @handlers.on("A")
    def first(state: Counter, message: Message) -> Counter:
        return state

    with pytest.raises(InvalidConfig, match="already registered"):
        handlers.on("B", "A")(lambda state, message: state)
    with pytest.raises(InvalidConfig, match="callable"):
        handlers.on("C")(None)  # type: ignore[arg-type]
    message = Message(id="m", type="B", payload={})
    with pytest.raises(Exception, match="no handler for message type 'B'"):
        handlers(Counter(), message)  # B was not registered by the refused call
    assert handlers(Counter(), Message(id="m", type="A", payload={})) == Counter()
