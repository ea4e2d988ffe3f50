"""Kafka publishers against a real broker: delivery reports, record layout, routing,
failures. Tests taking ``make_publisher`` run for ``KafkaPublisher`` and
``AsyncKafkaPublisher`` alike."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from confluent_kafka import KafkaError

from benchmarks.ledger import make_entry
from benchmarks.servers import Topics
from docoutbox.codec import WireFormat, decode_entry, decode_message, schema
from docoutbox.errors import BrokerUnavailable, DocOutboxError, PermanentPublishError
from docoutbox.ports.dispatch import Publisher
from docoutbox.ports.kit import BrokerSettings
from docoutbox_kafka import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_kafka.broker import BROKER
from docoutbox_kafka.publisher import _Sending
from tests.support.aio import Blocking
from tests.support.kafka import proxied_ports
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.kafka


@pytest.fixture(params=["sync", "asyncio"])
def make_publisher(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of Kafka publishers: ``KafkaPublisher``, or ``AsyncKafkaPublisher`` run on
    its own event loop; the same tests hold for both."""
    made: list[Any] = []

    def make(config: Any, topic: str | None = None, **options: Any) -> Any:
        if request.param == "sync":
            publisher: Any = KafkaPublisher(config, topic, **options)
        else:
            publisher = Blocking(AsyncKafkaPublisher(config, topic, **options))
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        publisher.close()


@pytest.fixture
def proxy(kafka: str) -> Iterator[TcpProxy]:
    """A proxy on the port the broker's PROXIED listener advertises."""
    listener, advertised = proxied_ports()
    with TcpProxy(("127.0.0.1", listener), port=advertised) as created:
        yield created


def test_round_trip_of_key_headers_timestamp_and_value(
    kafka: str, topics: Topics, make_publisher: Any
) -> None:
    topic = topics.create()
    with make_publisher(kafka, topic) as publisher:
        assert isinstance(publisher, Publisher)
        entry = make_entry(
            "p1",
            7,
            headers={"traceparent": "00-abc-def-01", "tenant": "t1"},
            correlation_id="corr-1",
            causation_id="cause-1",
        )
        publisher.publish(entry)
        # No flush: publish returned after the delivery report, so the record is there.
        assert topics.size(topic) == 1
    [record] = topics.read(topic, 1)
    assert decode_entry(record.value()) == entry
    assert record.key() == b"p1"
    assert record.timestamp()[1] == int(entry.created_at.timestamp() * 1000)
    assert dict(record.headers()) == {
        "traceparent": b"00-abc-def-01",
        "tenant": b"t1",
        "content-type": b"application/json",
        "id": entry.id.encode(),
        "type": b"Event",
        "seq": b"7",
        "aggregate_id": b"p1",
        "aggregate_type": b"Producer",
        "correlation_id": b"corr-1",
        "causation_id": b"cause-1",
    }


def test_topic_from_route_destination_default_or_type(
    kafka: str, topics: Topics, make_publisher: Any
) -> None:
    routed, destined, default = topics.create(), topics.create(), topics.create()
    by_type = topics.create("dx-type")
    with make_publisher(kafka, default) as publisher:
        publisher.publish(make_entry(seq=1, destination=destined))
        publisher.publish(make_entry(seq=2))
        publisher.route = lambda entry: routed
        publisher.publish(make_entry(seq=3, destination=destined))
    with make_publisher(kafka) as publisher:
        publisher.publish(make_entry(seq=4, type=by_type))  # no destination nor default
    assert [decode_entry(r.value()).seq for r in topics.read(destined, 1)] == [1]
    assert [decode_entry(r.value()).seq for r in topics.read(default, 1)] == [2]
    assert [decode_entry(r.value()).seq for r in topics.read(routed, 1)] == [3]
    assert [decode_entry(r.value()).seq for r in topics.read(by_type, 1)] == [4]


def test_an_aggregate_keeps_one_partition_and_its_order(
    kafka: str, topics: Topics, make_publisher: Any
) -> None:
    topic = topics.create(partitions=4)
    with make_publisher(kafka, topic) as publisher:
        for seq in range(1, 11):
            for producer in ("a", "b", "c", "d", "e"):
                publisher.publish(make_entry(producer, seq))
    records = topics.read(topic, 50)
    partitions: dict[str, set[int]] = {}
    seqs: dict[str, list[int]] = {}
    for record in records:
        entry = decode_entry(record.value())
        partitions.setdefault(str(entry.aggregate_id), set()).add(record.partition())
        seqs.setdefault(str(entry.aggregate_id), []).append(entry.seq)
    assert all(len(p) == 1 for p in partitions.values())
    assert len(set().union(*partitions.values())) > 1  # keys spread over partitions
    assert seqs == {p: list(range(1, 11)) for p in "abcde"}


def test_missing_topic_holds_entries_until_created(
    kafka: str, topics: Topics, make_publisher: Any
) -> None:
    missing = f"dx-missing-{id(topics)}"
    config = {"bootstrap.servers": kafka, "topic.metadata.propagation.max.ms": 1000}
    with make_publisher(config, missing) as publisher:
        with pytest.raises(BrokerUnavailable, match="UNKNOWN_TOPIC"):
            publisher.publish(make_entry())
        topic = topics.create()
        publisher.topic = topic
        publisher.publish(make_entry())
    assert topics.size(topic) == 1


def test_oversized_record_is_permanent_and_never_sent(
    kafka: str, topics: Topics, make_publisher: Any
) -> None:
    topic = topics.create()
    with make_publisher({"bootstrap.servers": kafka, "message.max.bytes": 2000}, topic) as pub:
        big = make_entry(headers={"blob": "x" * 3000})
        with pytest.raises(PermanentPublishError, match="MSG_SIZE_TOO_LARGE"):
            pub.publish(big)
        pub.publish(make_entry())
    assert topics.size(topic) == 1
    assert decode_entry(topics.read(topic, 1)[0].value()).id != big.id


def test_broker_down_raises_until_it_is_back(
    kafka: str, topics: Topics, proxy: TcpProxy, make_publisher: Any
) -> None:
    topic = topics.create()
    config = {
        "bootstrap.servers": f"127.0.0.1:{proxy.port}",
        "message.timeout.ms": 2000,
        "reconnect.backoff.max.ms": 200,
    }
    with make_publisher(config, topic) as publisher:
        publisher.publish(make_entry(seq=1))
        proxy.refuse = True
        proxy.cut()
        for seq in (2, 3):
            with pytest.raises(BrokerUnavailable, match="_MSG_TIMED_OUT"):
                publisher.publish(make_entry(seq=seq))
        proxy.refuse = False
        publisher.publish(make_entry(seq=4))
    # A record whose report timed out may still have been written (at least once); the
    # ones after the outage are in order.
    seqs = [decode_entry(r.value()).seq for r in topics.read(topic, topics.size(topic))]
    assert seqs[0] == 1 and seqs[-1] == 4 and seqs == sorted(seqs)


def test_lost_connection_mid_publish_is_retried_without_duplicates(
    kafka: str, topics: Topics, proxy: TcpProxy, make_publisher: Any
) -> None:
    """The idempotent producer resends a produce request lost with its connection; the
    broker keeps one copy."""
    topic = topics.create()
    config = {
        "bootstrap.servers": f"127.0.0.1:{proxy.port}",
        "message.timeout.ms": 15000,
        "reconnect.backoff.max.ms": 200,
    }
    with make_publisher(config, topic) as publisher:
        publisher.publish(make_entry(seq=1))
        for seq in range(2, 6):
            threading.Timer(0.005, proxy.cut).start()
            publisher.publish(make_entry(seq=seq))
    assert topics.size(topic) == 5
    assert [decode_entry(r.value()).seq for r in topics.read(topic, 5)] == [1, 2, 3, 4, 5]


def test_threads_share_one_producer_with_records_in_flight_together(
    kafka: str, topics: Topics
) -> None:
    topic = topics.create(partitions=2)
    publisher = KafkaPublisher(kafka, topic)
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
    publisher.close()
    assert errors == []
    entries = [decode_entry(r.value()) for r in topics.read(topic, 100)]
    assert len(entries) == 100
    for worker in range(4):  # one thread's publishes keep their order
        assert [e.seq for e in entries if e.aggregate_id == f"w{worker}"] == list(range(1, 26))


def test_idempotence_and_acks_cannot_be_configured_away(kafka: str) -> None:
    publisher = KafkaPublisher(
        {"bootstrap.servers": kafka, "enable.idempotence": False, "acks": 1}, "t"
    )
    assert publisher._settings["enable.idempotence"] is True
    assert publisher._settings["acks"] == "all"


def test_repr_masks_secrets() -> None:
    publisher = KafkaPublisher(
        {"bootstrap.servers": "broker:9092", "sasl.password": "s3cret"}, "orders"
    )
    assert "s3cret" not in repr(publisher) and "broker:9092" in repr(publisher)


@pytest.mark.parametrize("wire", list(WireFormat))
def test_wire_formats_match_the_shipped_schemas(
    kafka: str, topics: Topics, wire: WireFormat, make_publisher: Any
) -> None:
    topic = topics.create()
    entry = make_entry("p1", 3, headers={"traceparent": "00-abc-def-01"})
    with make_publisher(kafka, topic, wire=wire) as publisher:
        publisher.publish(entry)
    [record] = topics.read(topic, 1)
    headers = {name: value.decode() for name, value in record.headers()}
    value, checker = record.value(), jsonschema.FormatChecker()
    assert record.key() == b"p1"
    if wire is WireFormat.PLAIN:
        jsonschema.validate(json.loads(value), schema("entry"), format_checker=checker)
    elif wire is WireFormat.STRUCTURED:
        assert headers == {"content-type": "application/cloudevents+json"}
        jsonschema.validate(json.loads(value), schema("cloudevent"), format_checker=checker)
    else:
        assert headers["content-type"] == "application/json"
        attributes: dict[str, object] = {
            k.removeprefix("ce_"): v for k, v in headers.items() if k.startswith("ce_")
        }
        assert len(attributes) == len(headers) - 1
        attributes["seq"] = int(str(attributes["seq"]))  # Kafka headers are text
        event = {**attributes, "datacontenttype": "application/json", "data": json.loads(value)}
        jsonschema.validate(event, schema("cloudevent"), format_checker=checker)
    assert decode_message(value, headers, headers.get("content-type")) == entry.to_message()


def test_a_producer_that_failed_fatally_is_replaced(kafka: str, topics: Topics) -> None:
    """After a fatal error (the idempotent producer's state is lost) the next publish runs
    on a new producer instead of failing forever."""
    topic = topics.create()
    with KafkaPublisher(kafka, topic) as publisher:
        publisher.publish(make_entry(seq=1))
        broken = publisher._producer
        publisher._on_error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        publisher.publish(make_entry(seq=2))
        assert publisher._producer is not None and publisher._producer is not broken
    assert [decode_entry(r.value()).seq for r in topics.read(topic, 2)] == [1, 2]


def test_a_full_local_queue_waits_instead_of_failing(
    kafka: str, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for one record in the producer's queue, four threads publishing at once
    hit BufferError; each publish waits for room and none fails."""
    topic = topics.create()
    config = {"bootstrap.servers": kafka, "queue.buffering.max.messages": 1}
    publisher = KafkaPublisher(config, topic)
    errors: list[BaseException] = []
    full = 0
    produce = _Sending.produce

    def counting(self: _Sending) -> bool:
        nonlocal full
        queued = produce(self)
        full += not queued
        return queued

    def work(worker: int) -> None:
        try:
            for seq in range(1, 11):
                publisher.publish(make_entry(f"w{worker}", seq))
        except BaseException as exc:
            errors.append(exc)

    monkeypatch.setattr(_Sending, "produce", counting)
    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    publisher.close()
    assert errors == []
    assert full > 0
    assert topics.size(topic) == 40


def test_check_fails_fast_on_a_missing_topic_or_an_unreachable_cluster(
    kafka: str, topics: Topics
) -> None:
    topic = topics.create()
    with KafkaPublisher(kafka, topic) as publisher:
        publisher.check(timeout=10)
    absent = KafkaPublisher(kafka, f"dx-absent-{id(topics)}")
    with absent, pytest.raises(PermanentPublishError, match="does not exist"):
        absent.check(timeout=10)
    with KafkaPublisher("127.0.0.1:1", topic) as publisher, pytest.raises(BrokerUnavailable):
        publisher.check(timeout=1)


def test_the_broker_adapter_passes_options_and_lingers_for_a_dispatcher(
    kafka: str, topics: Topics
) -> None:
    """``docoutbox dispatch`` and endpoints build their publisher through the adapter:
    its ``options`` reach librdkafka (they were dropped), ``linger.ms`` is 5 for a
    dispatcher's rounds unless they set it, and a setting librdkafka does not know is a
    typed error, not a silent drop."""
    topic = topics.create()
    lingering = BROKER.publisher(BrokerSettings(kafka, topic, timeout=10))
    with lingering:
        assert lingering._settings["linger.ms"] == 5
    options = {"linger.ms": "0", "client.id": "dx-options"}
    told = BROKER.publisher(BrokerSettings(kafka, topic, timeout=10, options=options))
    with told:
        assert told._settings["linger.ms"] == "0"
        assert told._settings["client.id"] == "dx-options"
    unknown = BrokerSettings(kafka, topic, timeout=10, options={"no.such.setting": "1"})
    with pytest.raises(DocOutboxError, match=r"no\.such\.setting"):
        BROKER.publisher(unknown)
