"""Benchmark: dispatch throughput to Kafka against a raw confluent-kafka produce loop of the
same records, in the same run, on the same broker.

- raw produce loop (baseline): the records the dispatcher published (same topic, key,
  value, headers), produced flat out by one idempotent ``acks=all`` producer, then one
  ``flush()``: the broker and client ceiling, with no confirmation per record;
- raw produce + wait, one by one: each record produced and flushed before the next, which
  is what "confirm before trimming" costs without concurrency;
- KafkaPublisher x4 threads: :class:`~docoutbox_kafka.KafkaPublisher` alone, from as many
  threads as the dispatcher's default concurrency, each ``publish`` waiting for its report;
- Dispatcher -> Kafka: the real dispatcher following the change stream of the wire server
  (N commits made first, 10 pending entries per aggregate), publishing through
  ``KafkaPublisher`` and trimming; timed until the last record is confirmed;
- Dispatcher -> memory: the same with the in-memory publisher, the dispatcher's own
  ceiling on this server.

The broker is ``scripts/servers.sh start-kafka``'s (or ``$DOCOUTBOX_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import Producer

from benchmarks.common import Scale, Table, connect, interleaved, median, paired_ratio, ratio_range
from benchmarks.dispatch import TIMEOUT, DispatchReader, Workbench, _wait, backlog
from benchmarks.servers import Topics, kafka_available, kafka_bootstrap
from docoutbox import Dispatcher, OutboxMessage
from docoutbox.codec import encode_entry
from docoutbox.testing.publisher import MemoryDeadLetters
from docoutbox_kafka import KafkaPublisher
from docoutbox_kafka.publisher import DEFAULTS, REQUIRED
from docoutbox_kafka.records import headers_for
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.changes import MongoChangeSource

DENSITY = 10
THREADS = 4
ROUNDS = 3


class CountingKafka(KafkaPublisher):
    """The Kafka publisher, keeping each confirmed entry and when it was confirmed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic)
        self.at: dict[str, float] = {}
        self.entries: list[OutboxMessage] = []
        self._guard = threading.Lock()

    def publish(self, entry: OutboxMessage) -> None:
        super().publish(entry)
        with self._guard:
            if entry.id not in self.at:
                self.at[entry.id] = time.perf_counter()
                self.entries.append(entry)


def _producer(bootstrap: str, topic: str) -> Any:
    """A connected producer: one record delivered already, so no variant times the
    connection and the idempotent producer's ID request."""

    producer = Producer({**DEFAULTS, "bootstrap.servers": bootstrap, **REQUIRED})
    _warm(producer, topic)
    return producer


def _warm(producer: Any, topic: str) -> None:
    producer.produce(topic, b"warm-up", b"warm-up")
    assert producer.flush(TIMEOUT) == 0


def raw_loop(bootstrap: str, topic: str, entries: list[OutboxMessage]) -> float:
    producer = _producer(bootstrap, topic)
    began = time.perf_counter()
    for entry in entries:
        while True:
            try:
                producer.produce(
                    topic, encode_entry(entry), str(entry.aggregate_id).encode(),
                    headers=headers_for(entry),
                )  # fmt: skip
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(TIMEOUT)
    assert left == 0, f"{left} records undelivered"
    return len(entries) / (time.perf_counter() - began)


def raw_one_by_one(bootstrap: str, topic: str, entries: list[OutboxMessage]) -> float:
    producer = _producer(bootstrap, topic)
    began = time.perf_counter()
    for entry in entries:
        producer.produce(
            topic, encode_entry(entry), str(entry.aggregate_id).encode(),
            headers=headers_for(entry),
        )  # fmt: skip
        assert producer.flush(TIMEOUT) == 0
    return len(entries) / (time.perf_counter() - began)


def publisher_threads(bootstrap: str, topic: str, entries: list[OutboxMessage]) -> float:
    publisher = KafkaPublisher(bootstrap, topic)
    _warm(publisher._current(), topic)
    shares = [entries[i::THREADS] for i in range(THREADS)]
    errors: list[BaseException] = []

    def work(share: list[OutboxMessage]) -> None:
        try:
            for entry in share:
                publisher.publish(entry)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(share,)) for share in shares]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = len(entries) / (time.perf_counter() - began)
    publisher.close()
    assert not errors, errors
    return rate


class KafkaDispatch(DispatchReader):
    """The benchmark's dispatcher (as :class:`DispatchReader`), publishing to Kafka."""

    def __init__(self, bench: Workbench, publisher: CountingKafka) -> None:
        self.bench = bench
        self.kafka = publisher
        config, checkpoints = bench.resumed()
        self.dispatcher = Dispatcher(
            MongoBackend(bench.coll),
            publisher,
            MemoryDeadLetters(),
            source=MongoChangeSource(bench.coll),
            checkpoints=checkpoints,
            config=config,
        )
        self.thread = threading.Thread(target=self.dispatcher.run, daemon=True)

    @property
    def seen(self) -> dict[str, float]:
        return self.kafka.at

    def finish(self) -> None:
        self.dispatcher.stop()
        self.thread.join(TIMEOUT)
        pending = self.bench.coll.count_documents({"outbox.0": {"$exists": True}})
        if pending or set(self.kafka.at) != set(self.bench.committed):
            raise AssertionError(
                f"dispatcher left {pending} documents pending, published "
                f"{len(self.kafka.at)} of {len(self.bench.committed)} committed entries"
            )


def dispatcher(
    client: Any, bootstrap: str, topic: str, entries: int, sink: list[OutboxMessage] | None
) -> float:
    """Dispatch ``entries`` fresh commits to Kafka (or to memory when ``sink`` is None);
    an empty ``sink`` receives the published entries."""
    bench = backlog(client, entries, DENSITY)
    kafka = CountingKafka(bootstrap, topic) if sink is not None else None
    if kafka is not None:
        _warm(kafka._current(), topic)
    reader = DispatchReader(bench) if kafka is None else KafkaDispatch(bench, kafka)
    began = time.perf_counter()
    reader.start()
    _wait(lambda: len(reader.seen) >= entries)
    rate = entries / (max(reader.seen.values()) - began)
    reader.finish()
    if kafka is not None:
        kafka.close()
        if sink is not None and not sink:
            sink.extend(kafka.entries)
    return rate


def broker() -> str:
    """The benchmarks' Kafka bootstrap address; exits saying how to start it if it is down."""
    bootstrap = kafka_bootstrap()
    reason = kafka_available(bootstrap)
    if reason is not None:
        raise SystemExit(f"{reason}; run scripts/servers.sh install-kafka start-kafka")
    return bootstrap


def run(uri: str, scale: Scale) -> Table:
    bootstrap = broker()
    client = connect(uri)
    topics = Topics(bootstrap)
    entries = scale.dispatch_entries
    rounds = min(scale.rounds, ROUNDS)
    try:
        topic = topics.create(f"bench-{uuid.uuid4().hex[:6]}", partitions=4)
        records: list[OutboxMessage] = []
        dispatcher(client, bootstrap, topic, entries, records)  # the records, and a warm-up
        assert len(records) == entries, (len(records), entries)
        plan: dict[str, Callable[[], float]] = {
            "raw": partial(raw_loop, bootstrap, topic, records),
            "one-by-one": partial(raw_one_by_one, bootstrap, topic, records[: entries // 4]),
            "publisher": partial(publisher_threads, bootstrap, topic, records),
            "dispatcher": partial(dispatcher, client, bootstrap, topic, entries, []),
            "memory": partial(dispatcher, client, bootstrap, topic, entries, None),
        }
        samples = interleaved(plan, rounds, scale.warmup)
    finally:
        topics.close()
        client.drop_database("docoutbox_bench")
        client.close()
    return _table(samples, entries)


LABELS = {
    "raw": "raw confluent-kafka produce loop, one flush",
    "one-by-one": "raw produce + flush, one record at a time",
    "publisher": f"KafkaPublisher, {THREADS} threads (no database)",
    "dispatcher": "Dispatcher -> KafkaPublisher (change stream, trims)",
    "memory": "Dispatcher -> MemoryPublisher (same stream)",
}


def _table(samples: dict[str, list[float]], entries: int) -> Table:
    table = Table(
        "kafka",
        "Dispatch throughput to Kafka vs a raw confluent-kafka produce loop of the same records",
        ["variant", "records/s", "vs raw loop", "vs dispatcher -> memory"],
    )
    for name, label in LABELS.items():
        low, high = ratio_range(samples[name], samples["raw"])
        ratio = paired_ratio(samples[name], samples["raw"])
        to_memory = paired_ratio(samples[name], samples["memory"])
        table.add(
            label,
            median(samples[name]),
            f"{ratio:.3f}x ({low:.3f}-{high:.3f})",
            f"{to_memory:.2f}x",
        )
        table.figures[name] = {
            "per_s": median(samples[name]),
            "ratio_to_raw": ratio,
            "ratio_to_memory": to_memory,
        }
    table.notes += [
        f"{entries:,} records per round (one entry per commit, {DENSITY} pending entries per "
        f"aggregate, {entries // DENSITY:,} aggregates = record keys) on a 4-partition topic "
        "of a single-node KRaft broker on the same machine; producers are idempotent with "
        "acks=all, linger.ms=0 (the publisher's default), and connected (one record "
        "delivered) before timing starts. 'one-by-one' runs a quarter of "
        "the records. Ratios are medians over rounds of the per-round ratio (interquartile "
        "range, or min-max below 4 rounds, in brackets).",
        "Every dispatcher round checks that each entry was published and trimmed; the raw "
        "loops check that every record was delivered.",
    ]
    return table
