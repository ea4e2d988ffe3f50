"""Endpoint declarations are checked when they are made (one clear EndpointConfigError per
mistake), secrets are read from the environment only when asked and never shown in a
repr, and the in-memory TestBus refuses what it cannot run."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox import Aggregate, Handlers, Message, StoreConfig
from docoutbox.errors import InvalidConfig
from docoutbox.stored import Codec, Upcasters, Zlib
from docoutbox.testing import MemoryPublisher
from docoutbox_app.endpoint import (
    Broker,
    Endpoint,
    EndpointConfigError,
    KafkaTopic,
    RabbitQueue,
    Store,
    env,
    payload_field,
)
from docoutbox_app.testing import TestBus
from docoutbox_app.wiring import DispatchOptions


class Thing(Aggregate):
    n: int = 0


handlers: Handlers[Thing] = Handlers()


@handlers.on("Make", "Bump")
def bump(thing: Thing, message: Message) -> Thing:
    return thing.model_copy(update={"n": thing.n + 1})


STORE = Store("mongo", env("T_MONGO_URL"), "db", "things")
QUEUE = RabbitQueue(queue="things", route=payload_field("id"), creates={"Make"})


def make(**changes: Any) -> Endpoint[Thing]:
    arguments: dict[str, Any] = {
        "store": STORE,
        "inputs": [QUEUE],
        "output": MemoryPublisher(),
        **changes,
    }
    name = arguments.pop("name", "things")
    return Endpoint(name, Thing, arguments.pop("handlers", handlers), **arguments)


def test_a_well_formed_endpoint() -> None:
    endpoint = make()
    assert endpoint.dispatch.name == "things"
    assert repr(endpoint) == "<Endpoint things Thing inputs=[rabbitmq:things]>"


def test_the_dispatcher_decodes_what_the_store_encodes() -> None:
    codec, upcasters = Codec(Zlib()), Upcasters()
    config = make(config=StoreConfig(codec=codec, upcasters=upcasters)).dispatch.config()
    assert config.codec is codec and config.upcasters is upcasters
    own = Codec(Zlib(level=1))
    chosen = make(config=StoreConfig(codec=codec), dispatch=DispatchOptions(codec=own))
    assert chosen.dispatch.config().codec is own
    assert make().dispatch.config().codec is None


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"name": "two words"}, "name"),
        ({"name": ""}, "name"),
        ({"inputs": []}, "at least one input"),
        ({"inputs": [QUEUE, QUEUE]}, "rabbitmq:things is an input twice"),
        ({"inputs": ["things"]}, "RabbitQueue or a KafkaTopic"),
        ({"store": "mongodb://x"}, "store must be"),
        ({"output": "amqp://x"}, "output must be"),
        ({"handlers": 3}, "handlers must be"),
        (
            {"inputs": [RabbitQueue(queue="q", route=str, creates={"Mak"})]},
            "lets Mak create an aggregate, but no handler handles it",
        ),
    ],
)
def test_misconfigurations_are_one_clear_error(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(EndpointConfigError, match=says):
        make(**changes)


def test_inputs_check_their_own_values() -> None:
    with pytest.raises(EndpointConfigError, match="queue"):
        RabbitQueue(queue="", route=str)
    with pytest.raises(EndpointConfigError, match="route"):
        RabbitQueue(queue="q", route="id")  # type: ignore[arg-type]
    with pytest.raises(EndpointConfigError, match="prefetch"):
        RabbitQueue(queue="q", route=str, prefetch=0)
    with pytest.raises(InvalidConfig, match="collection of message types"):
        RabbitQueue(queue="q", route=str, creates="Make")
    with pytest.raises(EndpointConfigError, match="at least one topic"):
        KafkaTopic(topics=[], group="g", route=str)
    assert KafkaTopic(topics="t", group="g", route=str).topics == ("t",)


def test_secrets_come_from_the_environment_at_start_and_are_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint = make(output=Broker("rabbitmq", env("T_AMQP")))
    monkeypatch.delenv("T_MONGO_URL", raising=False)
    with pytest.raises(EndpointConfigError, match="environment variable T_MONGO_URL is not set"):
        endpoint.settings()
    monkeypatch.setenv("T_MONGO_URL", "mongodb://user:s3cret@db:27017")
    monkeypatch.setenv("T_AMQP", "amqp://guest:pw-amqp@mq/")
    settings = endpoint.settings()
    assert settings.store is not None and settings.store.url == "mongodb://user:s3cret@db:27017"
    assert {"s3cret", "pw-amqp"} <= set(settings.secrets())
    for shown in (repr(settings), repr(endpoint), repr(STORE), repr(endpoint.output)):
        assert "s3cret" not in shown and "pw-amqp" not in shown


def test_payload_field_routes_and_refuses_a_message_without_it() -> None:
    route = payload_field("id")
    assert route(Message(id="m", type="Make", payload={"id": "t-1"})) == "t-1"
    with pytest.raises(InvalidConfig, match="no 'id' field"):
        route(Message(id="m", type="Make", payload={"id": True}))


def test_the_bus_runs_an_endpoint_in_memory() -> None:
    bus = TestBus(make())
    bus.send("things", {"id": "m-1", "type": "Make", "payload": {"id": "t-1"}}, times=2)
    bus.send("things", {"id": "m-2", "type": "Bump", "payload": {"id": "t-1"}})
    assert bus.state("things", "t-1") == Thing(n=2)
    [early] = bus.send("things", {"id": "m-3", "type": "Bump", "payload": {"id": "t-2"}})
    assert early.action == "reject" and bus.state("things", "t-2") is None
    with pytest.raises(EndpointConfigError, match="no endpoint 'nope'"):
        bus.state("nope", "t-1")
    with pytest.raises(EndpointConfigError, match="no input"):
        bus.send("things", {"id": "m", "type": "Make"}, input="kafka:x")
    with pytest.raises(EndpointConfigError, match="named 'things'"):
        TestBus(make(), make())
