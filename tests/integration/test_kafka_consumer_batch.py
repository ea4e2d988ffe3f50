"""KafkaConsumer and AsyncKafkaConsumer handling a poll per aggregate with ``handle_batch``,
against a real broker: few writes, exactly once with redeliveries, handler retries then
the dead-letter store, and no offset committed past a record not yet written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from benchmarks.servers import Topics
from docoutbox import AggregateStore, AsyncAggregateStore, InboxPolicy, Message, StoreConfig
from docoutbox.codec import decode_entry
from docoutbox.errors import InvalidConfig
from docoutbox.model import OutboxMessage
from docoutbox.receive import HandlerRetry
from docoutbox.retry import RetryPolicy
from docoutbox.testing import AsyncMemoryBackend, MemoryDeadLetters
from docoutbox_kafka import KafkaConsumer, KafkaPublisher
from docoutbox_kafka.aio import AsyncKafkaConsumer
from tests.support.aio import Blocking
from tests.support.e2e import FaultyBackend

pytestmark = pytest.mark.kafka

EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))
FAST_RETRY = HandlerRetry(immediate=1, delayed=2, base_delay=0.01, max_delay=0.02)
CLIENTS = ["sync", "asyncio"]


class Crash(BaseException):
    """The process dies: nothing after this point runs."""


class Letters:
    """A dead-letter store over MemoryDeadLetters, with an async ``put`` for asyncio."""

    def __init__(self, asynchronous: bool) -> None:
        self.memory = MemoryDeadLetters()
        self.put: Any = self._put_async if asynchronous else self.memory.put

    async def _put_async(self, *args: Any, **kwargs: Any) -> None:
        self.memory.put(*args, **kwargs)


@pytest.fixture
def topic(topics: Topics) -> str:
    return topics.create(partitions=2)


def publish(kafka: str, topic: str, entries: list[OutboxMessage]) -> None:
    with KafkaPublisher(kafka, topic) as publisher:
        for entry in entries:
            publisher.publish(entry)


@pytest.fixture(params=CLIENTS)
def consumer(request: pytest.FixtureRequest, kafka: str, topic: str) -> Iterator[Any]:
    """A factory of consumers of one flavour (sync, or asyncio on its own event loop over
    an async store sharing the backend); left without committing anything more."""
    opened: list[Any] = []

    def make(
        backend: FaultyBackend, group: str, config: StoreConfig = EXACT, **options: Any
    ) -> Any:
        common: dict[str, Any] = {
            "aggregate_id_of": by_source,
            "create": True,
            "requeue_delay": 0.01,
            "retry": FAST_RETRY,
            **options,
        }
        if "dead_letters" not in common:
            common["dead_letters"] = Letters(request.param == "asyncio")
        settings = {"bootstrap.servers": kafka}
        if request.param == "sync":
            store = AggregateStore(backend, Ledger, config)
            created: Any = KafkaConsumer(settings, topic, group, store, ledger_handlers, **common)
        else:
            astore = AsyncAggregateStore(AsyncMemoryBackend(backend), Ledger, config)
            created = Blocking(
                AsyncKafkaConsumer(settings, topic, group, astore, ledger_handlers, **common)
            )
        opened.append(created)
        return created

    yield make
    while opened:
        abandon(opened.pop())


def abandon(worker: Any) -> None:
    """Leave the group without committing anything more (as a dead process would)."""
    if isinstance(worker, Blocking):
        target = worker._store
        if target._consumer is not None:
            worker._loop.run_until_complete(target._consumer.close())
            target._consumer = None
        worker._loop.close()
    elif worker._consumer is not None:
        worker._consumer.close()
        worker._consumer = None


def group_name() -> str:
    return f"dx-group-{uuid.uuid4().hex[:8]}"


def ledger(backend: FaultyBackend, producer: str) -> Ledger:
    return AggregateStore(backend, Ledger).get(f"Producer/{producer}").state


def counting(backend: FaultyBackend) -> list[int]:
    writes: list[int] = []
    backend.after_write = lambda: writes.append(1)
    return writes


def test_a_poll_is_written_per_aggregate_exactly_once_in_order(
    topics: Topics, topic: str, consumer: Any, kafka: str
) -> None:
    entries = [make_entry(p, seq) for seq in range(1, 21) for p in "abc"]
    publish(kafka, topic, entries + entries[::3])  # every third record comes twice
    backend = FaultyBackend()
    writes = counting(backend)
    group = group_name()
    worker = consumer(backend, group)
    stats = worker.run(max_messages=80, idle_timeout=10)
    assert (stats.delivered, stats.applied, stats.duplicates) == (80, 60, 20)
    for producer in "abc":
        assert ledger(backend, producer).seqs == {f"Producer/{producer}": list(range(1, 21))}
    assert topics.committed_total(topic, group) == 80
    assert len(writes) < 30  # per message it would be 60 writes


def test_a_poison_record_is_retried_then_kept_in_the_dead_letter_store(
    topics: Topics, topic: str, consumer: Any, kafka: str
) -> None:
    """The poison message sits between good ones of its aggregate: those before and after
    it are applied in order, it is handled 1 + 3 times, then kept with its error."""
    poison = make_entry("a", 3)
    entries = [make_entry("a", 1), make_entry("a", 2), poison, make_entry("a", 4)]
    entries += [make_entry("b", 1), make_entry("b", 2)]
    publish(kafka, topic, entries)
    calls: list[str] = []

    def handler(state: Ledger, message: Message) -> Ledger:
        if message.id == poison.id:
            calls.append(message.id)
            raise RuntimeError("poison")
        return ledger_handlers(state, message)  # type: ignore[return-value]

    backend = FaultyBackend()
    group = group_name()
    worker = consumer(backend, group)
    worker.handler = handler
    stats = worker.run(max_messages=6, idle_timeout=10)
    assert (stats.applied, stats.rejected, stats.dead_lettered, stats.retried) == (5, 1, 1, 3)
    assert calls == [poison.id] * 4
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 4]
    assert ledger(backend, "b").seqs["Producer/b"] == [1, 2]
    kept = worker.dead_letters.memory.entries[poison.id]
    assert (kept["origin"], kept["queue"], kept["attempts"]) == ("consume", f"kafka:{topic}", 4)
    assert "poison" in kept["error"] and decode_entry(kept["body"].encode()).id == poison.id
    assert topics.committed_total(topic, group) == 6


def test_no_offset_is_committed_past_a_record_whose_write_did_not_happen(
    topics: Topics, topic: str, consumer: Any, kafka: str
) -> None:
    """The process dies after the first aggregate's write of a poll, before the second's:
    no offset of that poll is committed; the next member reads it all again and applies
    every record once."""
    first_entries = [make_entry("a", seq) for seq in (1, 2, 3)]
    second_entries = [make_entry("b", seq) for seq in (1, 2, 3)]
    publish(kafka, topic, first_entries + second_entries)
    backend = FaultyBackend()
    writes: list[int] = []

    def crash() -> None:  # dies right after the first write of the poll
        writes.append(1)
        raise Crash

    group = group_name()
    first = consumer(backend, group, commit_every=1)  # any early commit would show
    first.run(max_messages=1, idle_timeout=10)  # joins the group; one record settled
    settled = topics.committed_total(topic, group)
    assert settled == 1
    backend.after_write = crash
    with pytest.raises(Crash):
        first.run(idle_timeout=10)
    assert len(writes) == 1
    assert topics.committed_total(topic, group) == settled  # nothing past the unwritten
    abandon(first)
    backend.after_write = None
    second = consumer(backend, group)
    stats = second.run(max_messages=5, idle_timeout=10)
    assert stats.applied + stats.duplicates == 5 and stats.duplicates >= 1
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3]
    assert ledger(backend, "b").seqs["Producer/b"] == [1, 2, 3]
    assert ledger(backend, "a").total + ledger(backend, "b").total == 6
    second.commit()
    assert topics.committed_total(topic, group) == 6


def test_without_batch_each_record_is_its_own_write(topic: str, consumer: Any, kafka: str) -> None:
    publish(kafka, topic, [make_entry("a", seq) for seq in range(1, 11)])
    backend = FaultyBackend()
    writes = counting(backend)
    stats = consumer(backend, group_name(), batch=False).run(max_messages=10, idle_timeout=10)
    assert stats.applied == 10 and len(writes) == 10


def test_a_consumer_without_any_dead_letters_is_refused() -> None:
    store = AggregateStore(FaultyBackend(), Ledger)
    with pytest.raises(InvalidConfig, match="dead_letter_topic or dead_letters"):
        KafkaConsumer("unused:9092", "t", "g", store, ledger_handlers, aggregate_id_of=by_source)


def test_a_refused_write_rewinds_and_the_poll_is_applied_in_order(
    topics: Topics, topic: str, consumer: Any, kafka: str
) -> None:
    publish(kafka, topic, [make_entry("a", seq) for seq in (1, 2, 3)])
    backend = FaultyBackend()
    backend.refuse_writes = 1  # one conflict; with a single attempt the store gives up
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True), retry=RetryPolicy(1))
    group = group_name()
    worker = consumer(backend, group, config)
    stats = worker.run(max_messages=6, idle_timeout=10)
    assert (stats.requeued, stats.applied, stats.redelivered) == (3, 3, 3)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3]
    assert topics.committed_total(topic, group) == 3


def test_invalid_records_go_to_the_dead_letter_topic(
    topics: Topics, topic: str, consumer: Any, kafka: str
) -> None:
    dead = topics.create("dx-dead")
    raw = Producer({"bootstrap.servers": kafka})
    raw.produce(topic, b"not json", b"a")
    raw.flush(10)
    publish(kafka, topic, [make_entry("a", 1)])
    backend = FaultyBackend()
    group = group_name()
    worker = consumer(backend, group, dead_letters=None, dead_letter_topic=dead)
    stats = worker.run(max_messages=2, idle_timeout=10)
    assert (stats.applied, stats.rejected, stats.dead_lettered) == (1, 1, 1)
    (record,) = topics.read(dead, 1)
    assert record.value() == b"not json"
    assert b"InvalidMessage" in dict(record.headers())["docoutbox-error"]
    assert topics.committed_total(topic, group) == 2
