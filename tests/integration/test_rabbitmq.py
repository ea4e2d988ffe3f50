"""RabbitMQ publishers against a real broker: confirms, properties, routing and failures.

Tests taking ``make_publisher`` run for pika's ``RabbitPublisher`` and aio-pika's
``AsyncRabbitPublisher`` alike.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aio_pika
import jsonschema
import pytest

from benchmarks.ledger import make_entry
from benchmarks.rabbit import Sandbox
from docoutbox.codec import WireFormat, decode_entry, decode_message, schema
from docoutbox.errors import BrokerUnavailable, PermanentPublishError, PublishError
from docoutbox.ports.dispatch import Publisher
from docoutbox_rabbitmq import RabbitPublisher
from docoutbox_rabbitmq.link import Link
from tests.support.e2e import broker_address, require_rabbitmq, through
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq


@pytest.fixture(scope="module")
def url() -> str:
    return require_rabbitmq()


@pytest.fixture
def proxy(url: str) -> Iterator[TcpProxy]:
    with TcpProxy(broker_address(url)) as created:
        yield created


def test_round_trip_of_properties_headers_and_body(
    url: str, box: Sandbox, make_publisher: Any
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(url, exchange) as publisher:
        assert isinstance(publisher, Publisher)
        publisher.declare(queues={queue: ["orders.#"]})
        entry = make_entry(
            "p1",
            7,
            destination="orders.created",
            headers={"traceparent": "00-abc-def-01", "tenant": "t1"},
            correlation_id="corr-1",
            causation_id="cause-1",
        )
        publisher.publish(entry)
    props, body = box.drain(queue)[0]
    assert decode_entry(body) == entry
    assert props.content_type == "application/json"
    assert props.delivery_mode == 2
    assert (props.message_id, props.type, props.correlation_id) == (entry.id, "Event", "corr-1")
    assert props.timestamp == int(entry.created_at.timestamp())
    assert props.headers == {
        "traceparent": "00-abc-def-01",
        "tenant": "t1",
        "seq": 7,
        "aggregate_id": "p1",
        "aggregate_type": "Producer",
        "causation_id": "cause-1",
    }


def test_routing_key_from_route_destination_default_or_type(
    url: str, box: Sandbox, make_publisher: Any
) -> None:
    exchange, queue, _ = box.names()
    keys = ["by-route", "by-destination", "by-default", "Event"]
    with make_publisher(url, exchange, routing_key="by-default") as publisher:
        publisher.declare(exchange_type="direct", queues={queue: keys})
        publisher.publish(make_entry(seq=1, destination="by-destination"))
        publisher.publish(make_entry(seq=2))
        publisher.route = lambda entry: "by-route"
        publisher.publish(make_entry(seq=3, destination="by-destination"))
    with make_publisher(url, exchange) as publisher:
        publisher.publish(make_entry(seq=4))  # no destination nor default: the type
    assert [decode_entry(body).seq for _, body in box.drain(queue)] == [1, 2, 3, 4]


def test_unroutable_message_raises_publish_error_and_channel_stays_usable(
    url: str, box: Sandbox, make_publisher: Any
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(url, exchange) as publisher:
        publisher.declare(exchange_type="direct", queues={queue: ["known"]})
        with pytest.raises(PublishError) as caught:
            publisher.publish(make_entry(destination="nobody-listens"))
        assert not isinstance(caught.value, PermanentPublishError)
        assert "312" in str(caught.value)
        assert "routing key 'nobody-listens'" in str(caught.value)
        publisher.publish(make_entry(destination="known"))
    assert len(box.drain(queue)) == 1


def test_missing_exchange_is_a_permanent_configuration_error(
    url: str, box: Sandbox, make_publisher: Any
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(url, exchange) as publisher:
        with pytest.raises(PermanentPublishError) as caught:
            publisher.publish(make_entry())
        assert "404" in str(caught.value) and "missing exchange" in str(caught.value)
        with pytest.raises(PermanentPublishError, match="does not exist"):
            publisher.check()
        publisher.declare(queues={queue: ["#"]})  # reopens the channel the 404 closed
        publisher.publish(make_entry())
    assert len(box.drain(queue)) == 1


def test_oversized_message_is_permanent_and_never_sent(
    url: str, box: Sandbox, make_publisher: Any
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(url, exchange, max_message_size=2000) as publisher:
        publisher.declare(queues={queue: ["#"]})
        big = make_entry(headers={"blob": "x" * 3000})
        with pytest.raises(PermanentPublishError, match="max_message_size"):
            publisher.publish(big)
        publisher.publish(make_entry())
    assert [decode_entry(b).id != big.id for _, b in box.drain(queue)] == [True]


def test_lost_publish_raises_broker_unavailable_then_reconnects(
    url: str, box: Sandbox, make_publisher: Any, proxy: TcpProxy
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(through(url, proxy.port), exchange) as publisher:
        publisher.declare(queues={queue: ["#"]})
        # The asyncio publisher publishes on a connection of its own: open it first.
        publisher.publish(make_entry(seq=1))
        proxy.drop_on_next_send()  # the publish frames vanish with the connection
        with pytest.raises(BrokerUnavailable):
            publisher.publish(make_entry(seq=2))
        publisher.publish(make_entry(seq=3))
    assert [decode_entry(b).seq for _, b in box.drain(queue)] == [1, 3]


def test_broker_down_raises_until_it_is_back(
    url: str, box: Sandbox, make_publisher: Any, proxy: TcpProxy
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(through(url, proxy.port), exchange, probe_idle=0) as publisher:
        publisher.declare(queues={queue: ["#"]})
        proxy.refuse = True
        proxy.cut()
        for seq in (1, 2):
            with pytest.raises(BrokerUnavailable) as caught:
                publisher.publish(make_entry(seq=seq))
            assert "guest:***@" in str(caught.value) and ":guest@" not in str(caught.value)
        proxy.refuse = False
        publisher.publish(make_entry(seq=3))
    assert [decode_entry(b).seq for _, b in box.drain(queue)] == [3]


def test_idle_connection_closed_by_peer_is_replaced_without_failing(
    url: str, box: Sandbox, make_publisher: Any, proxy: TcpProxy
) -> None:
    exchange, queue, _ = box.names()
    with make_publisher(through(url, proxy.port), exchange, probe_idle=0) as publisher:
        publisher.declare(queues={queue: ["#"]})
        publisher.publish(make_entry(seq=1))
        proxy.cut()
        publisher.publish(make_entry(seq=2))
    assert [decode_entry(b).seq for _, b in box.drain(queue)] == [1, 2]


def test_one_connection_per_thread(url: str, box: Sandbox) -> None:
    exchange, queue, _ = box.names()
    publisher = RabbitPublisher(url, exchange)
    publisher.declare(queues={queue: ["#"]})
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for seq in range(1, 26):
                publisher.publish(make_entry(f"w{worker}", seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(publisher._links) == 5  # the declaring thread and four workers
    publisher.close()
    assert publisher._links == []
    entries = [decode_entry(b) for _, b in box.drain(queue)]
    assert len(entries) == 100
    for worker in range(4):  # one thread's publishes keep their order
        assert [e.seq for e in entries if e.aggregate_id == f"w{worker}"] == list(range(1, 26))


def broker_connections(name: str) -> int | None:
    """How many connections named ``name`` the broker lists (``rabbitmqctl``), or None
    where ``rabbitmqctl`` cannot be run (not installed, or not as this user)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return None
    try:
        done = subprocess.run(
            [ctl, "-q", "list_connections", "client_properties"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return sum(f'"{name}"' in line for line in done.stdout.splitlines())


def own_connections(publisher: Any) -> int:
    """How many open connections the publisher holds, from its own state: pika's links,
    docoutbox's AMQP link, and any aio-pika connection among its attributes."""
    target = getattr(publisher, "_store", publisher)  # the async publisher in Blocking
    count = 0
    for value in vars(target).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Link):
                count += item.lost is None
            elif isinstance(item, aio_pika.abc.AbstractConnection):
                count += not item.is_closed
            elif hasattr(item, "connection") and hasattr(item.connection, "is_open"):
                count += bool(item.connection.is_open)  # a pika thread's link
    return count


def connections(publisher: Any, name: str, expected: int) -> int:
    """The publisher's connections as the broker lists them (as the publisher's own state
    counts them where the broker cannot be asked); the broker's list is read again for a
    while until it shows ``expected``, since it drops a closed connection asynchronously."""
    for _ in range(50):
        listed = broker_connections(name)
        if listed is None:
            return own_connections(publisher)
        if listed == expected:
            return listed
        time.sleep(0.1)
    return listed


def test_one_connection_remains_after_declare_and_check_and_none_after_close(
    url: str, box: Sandbox, make_publisher: Any
) -> None:
    """Declarations and checks do not leave a connection of their own open beside the
    publishing one; close leaves none."""
    exchange, queue, _ = box.names()
    name = f"docoutbox-test-{uuid.uuid4().hex[:12]}"
    publisher = make_publisher(url, exchange, connection_name=name)
    publisher.declare(queues={queue: ["#"]})
    publisher.check()
    publisher.check(declare_type="topic")
    publisher.publish(make_entry(seq=1))
    assert connections(publisher, name, 1) == 1
    assert own_connections(publisher) == 1
    publisher.close()
    assert connections(publisher, name, 0) == 0
    assert own_connections(publisher) == 0
    assert [decode_entry(b).seq for _, b in box.drain(queue)] == [1]


def test_repr_masks_the_password() -> None:
    publisher = RabbitPublisher("amqp://user:s3cret@broker.example:5672/%2F", "ex")
    assert "s3cret" not in repr(publisher) and "user:***@broker.example" in repr(publisher)


@pytest.mark.parametrize("wire", list(WireFormat))
def test_wire_formats_match_the_shipped_schemas(
    url: str, box: Sandbox, make_publisher: Any, wire: WireFormat
) -> None:
    exchange, queue, _ = box.names()
    entry = make_entry("p1", 3, headers={"traceparent": "00-abc-def-01"})
    with make_publisher(url, exchange, wire=wire) as publisher:
        publisher.declare(queues={queue: ["#"]})
        publisher.publish(entry)
    props, body = box.drain(queue)[0]
    assert props.message_id == entry.id
    checker = jsonschema.FormatChecker()
    if wire is WireFormat.PLAIN:
        assert props.content_type == "application/json"
        jsonschema.validate(json.loads(body), schema("entry"), format_checker=checker)
    elif wire is WireFormat.STRUCTURED:
        assert props.content_type == "application/cloudevents+json"
        jsonschema.validate(json.loads(body), schema("cloudevent"), format_checker=checker)
    else:
        assert props.content_type == "application/json"
        attributes = {
            k.removeprefix("cloudEvents:"): v
            for k, v in props.headers.items()
            if k.startswith("cloudEvents:")
        }
        assert len(attributes) == len(props.headers)
        event = {**attributes, "datacontenttype": props.content_type, "data": json.loads(body)}
        jsonschema.validate(event, schema("cloudevent"), format_checker=checker)
    assert decode_message(body, props.headers, props.content_type) == entry.to_message()
