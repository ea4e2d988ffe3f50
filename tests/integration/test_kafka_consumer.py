"""KafkaConsumer against a real broker: commit after the store's commit, de-duplication,
retries, and dead letters."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Producer

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from benchmarks.servers import Topics
from docoutbox import AggregateStore, InboxPolicy, Message, StoreConfig
from docoutbox.codec import WireFormat, decode_entry
from docoutbox.errors import BrokerUnavailable, PermanentStoreError, TransientStoreError
from docoutbox.model import OutboxMessage
from docoutbox.receive import HandlerRetry
from docoutbox.retry import RetryPolicy
from docoutbox_kafka import KafkaConsumer, KafkaPublisher
from tests.support.e2e import FaultyBackend

pytestmark = pytest.mark.kafka

EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))
FAST_RETRY = HandlerRetry(immediate=1, delayed=2, base_delay=0.01, max_delay=0.02)


class Crash(BaseException):
    """The process dies: nothing after this point runs."""


@pytest.fixture
def topic(topics: Topics) -> str:
    return topics.create(partitions=2)


@pytest.fixture
def dead(topics: Topics) -> str:
    return topics.create("dx-dead")


def publish(kafka: str, topic: str, entries: list[OutboxMessage]) -> None:
    with KafkaPublisher(kafka, topic) as publisher:
        for entry in entries:
            publisher.publish(entry)


_opened: list[KafkaConsumer[Ledger]] = []


@pytest.fixture(autouse=True)
def _close_consumers() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop()._consumer = None  # leave without committing anything more


def consumer(
    kafka: str,
    topic: str,
    dead: str,
    backend: FaultyBackend,
    config: StoreConfig = EXACT,
    *,
    group: str | None = None,
    settings: dict[str, object] | None = None,
    **options: object,
) -> KafkaConsumer[Ledger]:
    store = AggregateStore(backend, Ledger, config)
    created = KafkaConsumer(
        {"bootstrap.servers": kafka, **(settings or {})},
        topic,
        group or f"dx-group-{uuid.uuid4().hex[:8]}",
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        dead_letter_topic=dead,
        create=True,
        requeue_delay=0.01,
        **{"retry": FAST_RETRY, **options},  # type: ignore[arg-type]
    )
    _opened.append(created)
    return created


def ledger(backend: FaultyBackend, producer: str) -> Ledger:
    return AggregateStore(backend, Ledger).get(f"Producer/{producer}").state


def test_applies_each_record_once_in_order_and_commits(
    kafka: str, topics: Topics, topic: str, dead: str
) -> None:
    publish(kafka, topic, [make_entry(p, seq) for seq in range(1, 11) for p in "abc"])
    backend = FaultyBackend()
    worker = consumer(kafka, topic, dead, backend)
    stats = worker.run(max_messages=30, idle_timeout=10)
    worker.close()
    assert (stats.delivered, stats.applied, stats.duplicates) == (30, 30, 0)
    for producer in "abc":
        assert ledger(backend, producer).seqs == {f"Producer/{producer}": list(range(1, 11))}
    assert topics.committed_total(topic, worker.group) == topics.size(topic) == 30


@pytest.mark.parametrize("config", [EXACT, StoreConfig()], ids=["watermarks", "id-window"])
def test_republished_duplicates_are_committed_without_reapplying(
    kafka: str, topic: str, dead: str, config: StoreConfig
) -> None:
    entries = [make_entry("a", seq) for seq in range(1, 6)]
    publish(kafka, topic, entries + entries[::-1])
    backend = FaultyBackend()
    stats = consumer(kafka, topic, dead, backend, config).run(max_messages=10, idle_timeout=10)
    assert (stats.applied, stats.duplicates, stats.dead_lettered) == (5, 5, 0)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3, 4, 5]
    assert ledger(backend, "a").total == 5


def test_crash_between_store_commit_and_offset_commit_reads_a_duplicate(
    kafka: str, topics: Topics, topic: str, dead: str
) -> None:
    """One record a poll (``max_batch=1``); batches: test_kafka_consumer_batch.py."""
    publish(kafka, topic, [make_entry("a", 1), make_entry("a", 2)])
    backend = FaultyBackend()
    group = f"dx-group-{uuid.uuid4().hex[:8]}"
    first = consumer(kafka, topic, dead, backend, group=group, max_batch=1)
    applied: list[int] = []

    def crash() -> None:  # the process dies right after the store's commit of seq 2
        applied.append(1)
        if len(applied) == 2:
            raise Crash

    backend.after_write = crash
    with pytest.raises(Crash):
        first.run(idle_timeout=30)
    assert topics.committed_total(topic, group) == 1  # seq 1 only
    first._consumer.close()  # type: ignore[union-attr]
    first._consumer = None
    backend.after_write = None
    second = consumer(kafka, topic, dead, backend, group=group, max_batch=1)
    stats = second.run(max_messages=1, idle_timeout=10)
    assert (stats.applied, stats.duplicates) == (0, 1)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2]
    second.close()
    assert topics.committed_total(topic, group) == 2


def test_invalid_records_go_to_the_dead_letter_topic_and_consuming_goes_on(
    kafka: str, topics: Topics, topic: str, dead: str, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Producer({"bootstrap.servers": kafka})
    bad_values = [b"not json at all", b'{"id": "x", "type": "Event"}']
    for value in bad_values:
        raw.produce(topic, value, b"a", headers=[("origin", b"raw")])
    raw.flush(10)
    unknown = make_entry("a", 1, type="NoSuchType")
    good = make_entry("a", 2)
    exploding = make_entry("b", 1)
    publish(kafka, topic, [unknown, good, exploding])

    def handler(state: Ledger, message: Message) -> Ledger:
        if message.source == "Producer/b":
            raise RuntimeError("business rule broken")
        return ledger_handlers(state, message)  # type: ignore[return-value]

    backend = FaultyBackend()
    worker = consumer(kafka, topic, dead, backend)
    worker.handler = handler
    with caplog.at_level(logging.WARNING, logger="docoutbox.kafka"):
        stats = worker.run(max_messages=5, idle_timeout=10)
    worker.close()
    assert (stats.applied, stats.dead_lettered, stats.rejected, stats.retried) == (1, 4, 4, 3)
    assert topics.committed_total(topic, worker.group) == 5
    records = topics.read(dead, 4)
    values = [r.value() for r in records]
    assert set(bad_values) <= set(values)
    ids = {decode_entry(v).id for v in values if v not in bad_values}
    assert ids == {unknown.id, exploding.id}
    errors = {dict(r.headers())["docoutbox-error"].decode() for r in records}
    assert any("UnknownMessageType" in e for e in errors)
    assert any("business rule broken" in e for e in errors)
    raw_copy = next(r for r in records if r.value() == bad_values[0])
    headers = dict(raw_copy.headers())
    assert headers["origin"] == b"raw" and raw_copy.key() == b"a"
    assert headers["docoutbox-topic"] == topic.encode()
    assert headers["docoutbox-group"] == worker.group.encode()
    dead_lettered = [r for r in caplog.records if r.message.startswith("dead-lettering")]
    assert len(dead_lettered) == 4
    expected = [r for r in dead_lettered if r.levelno == logging.WARNING]  # one line each
    assert len(expected) == 2 and all(r.exc_info is None for r in expected)
    assert all("\n" not in r.getMessage() for r in expected)
    assert all(r.exc_info is not None for r in dead_lettered if r.levelno == logging.ERROR)


def test_no_commit_past_a_record_the_dead_letter_topic_did_not_take(
    kafka: str, topics: Topics
) -> None:
    topic = topics.create()  # one partition: the good record comes after the bad one
    raw = Producer({"bootstrap.servers": kafka})
    raw.produce(topic, b"not json", b"a")
    raw.flush(10)
    publish(kafka, topic, [make_entry("a", 1)])
    backend = FaultyBackend()
    group = f"dx-group-{uuid.uuid4().hex[:8]}"
    fast_failure = {"topic.metadata.propagation.max.ms": 500, "message.timeout.ms": 3000}
    worker = consumer(kafka, topic, "dx-no-such-topic", backend, group=group, settings=fast_failure)
    with pytest.raises(BrokerUnavailable):
        worker.run(idle_timeout=30)
    assert topics.committed_total(topic, group) == 0
    worker._consumer.close()  # type: ignore[union-attr]
    worker._consumer = None
    dead = topics.create("dx-dead")
    again = consumer(kafka, topic, dead, backend, group=group)
    stats = again.run(max_messages=2, idle_timeout=10)
    again.close()
    # The good record was written in the first poll already: now it is a duplicate.
    assert (stats.dead_lettered, stats.applied + stats.duplicates) == (1, 1)
    assert ledger(backend, "a").seqs["Producer/a"] == [1]
    assert topics.size(dead) == 1
    assert topics.committed_total(topic, group) == 2


def test_gave_up_is_read_again_then_applied_in_order(kafka: str, topic: str, dead: str) -> None:
    publish(kafka, topic, [make_entry("a", 1), make_entry("a", 2)])
    backend = FaultyBackend()
    backend.refuse_writes = 1  # one conflict; with a single attempt the store gives up
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True), retry=RetryPolicy(1))
    stats = consumer(kafka, topic, dead, backend, config).run(max_messages=4, idle_timeout=10)
    # Both records were polled together: one write, refused, so both are read again.
    assert (stats.requeued, stats.applied, stats.redelivered) == (2, 2, 2)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2]


def test_transient_store_error_is_read_again(kafka: str, topic: str, dead: str) -> None:
    publish(kafka, topic, [make_entry("a", 1)])
    backend = FaultyBackend()
    backend.load_errors = [TransientStoreError("flaky")] * 4  # twice what the store retries
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True), retry=RetryPolicy(2))
    stats = consumer(kafka, topic, dead, backend, config).run(max_messages=3, idle_timeout=10)
    assert (stats.requeued, stats.applied) == (2, 1)
    assert ledger(backend, "a").seqs["Producer/a"] == [1]


def test_permanent_store_error_rewinds_and_stops(
    kafka: str, topics: Topics, topic: str, dead: str
) -> None:
    publish(kafka, topic, [make_entry("a", 1)])
    backend = FaultyBackend()
    backend.load_errors = [PermanentStoreError("auth failed")]
    group = f"dx-group-{uuid.uuid4().hex[:8]}"
    worker = consumer(kafka, topic, dead, backend, group=group)
    with pytest.raises(PermanentStoreError):
        worker.run(idle_timeout=30)
    worker.close()
    assert topics.committed_total(topic, group) == 0
    again = consumer(kafka, topic, dead, backend, group=group)
    assert again.run(max_messages=1, idle_timeout=10).applied == 1


def test_idle_timeout_and_stop_event(kafka: str, topic: str, dead: str) -> None:
    worker = consumer(kafka, topic, dead, FaultyBackend())
    started = time.monotonic()
    assert worker.run(idle_timeout=0.3, poll=0.05).delivered == 0
    assert time.monotonic() - started < 5
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    worker.run(stop=stop, poll=0.05)
    assert time.monotonic() - started < 5
    worker.close()


@pytest.mark.parametrize("wire", list(WireFormat))
def test_every_wire_format_is_applied_once(
    kafka: str, topic: str, dead: str, wire: WireFormat
) -> None:
    entries = [make_entry("a", seq, headers={"traceparent": f"t{seq}"}) for seq in (1, 2, 3)]
    with KafkaPublisher(kafka, topic, wire=wire) as publisher:
        for entry in entries + entries:
            publisher.publish(entry)
    backend = FaultyBackend()
    stats = consumer(kafka, topic, dead, backend).run(max_messages=6, idle_timeout=10)
    assert (stats.applied, stats.duplicates, stats.dead_lettered) == (3, 3, 0)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3]


def test_a_rebalance_between_two_members_loses_and_doubles_nothing(
    kafka: str, topics: Topics, dead: str
) -> None:
    """A second member joins mid-stream (the first commits what it settled on the
    partitions it gives up), then the first leaves; every record is applied exactly once,
    each source in order, and none is read twice."""
    topic = topics.create(partitions=4)
    sources = [f"s{i}" for i in range(12)]
    publish(kafka, topic, [make_entry(s, seq) for seq in range(1, 21) for s in sources])
    backend = FaultyBackend()
    group = f"dx-group-{uuid.uuid4().hex[:8]}"
    small = {"commit_every": 1000, "max_batch": 10}  # polls small enough to share the stream
    first = consumer(kafka, topic, dead, backend, group=group, **small)
    second = consumer(kafka, topic, dead, backend, group=group, **small)

    def slow_until_the_second_member_works() -> None:  # so the rebalance is mid-stream
        if second.stats.delivered == 0:
            time.sleep(0.2)

    backend.after_write = slow_until_the_second_member_works
    stop_first, stop_second = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run(member: KafkaConsumer[Ledger], stop: threading.Event) -> None:
        try:
            member.run(stop=stop, poll=0.05)
            member.close()
        except BaseException as exc:
            errors.append(exc)

    def wait(condition: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline and not errors:
            time.sleep(0.01)

    a = threading.Thread(target=run, args=(first, stop_first))
    a.start()
    wait(lambda: first.stats.delivered >= 30)
    b = threading.Thread(target=run, args=(second, stop_second))
    b.start()
    wait(lambda: second.stats.delivered > 0)
    stop_first.set()
    a.join(timeout=60)
    wait(lambda: topics.committed_total(topic, group) >= 240)
    stop_second.set()
    b.join(timeout=60)
    assert errors == []
    assert first.stats.delivered > 0 and second.stats.delivered > 0
    for source in sources:
        assert ledger(backend, source).seqs == {f"Producer/{source}": list(range(1, 21))}
    assert topics.committed_total(topic, group) == 240
    assert first.stats.applied + second.stats.applied == 240
    # The first member committed what it had settled when it gave partitions up, so the
    # second started right after: nothing was read twice.
    assert first.stats.duplicates == second.stats.duplicates == 0
