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
  (N commits made first, 1 or 10 pending entries per aggregate), publishing through
  ``KafkaPublisher`` (each publish round produced whole, then its reports awaited) and
  trimming; timed until the last record is confirmed; the threaded driver, and the
  asyncio driver with ``AsyncKafkaPublisher``;
- Dispatcher -> Kafka with ``linger.ms`` 0 (the publisher's default): the same two
  dispatchers, their publisher sending a produce request for the first record of an
  empty queue instead of waiting up to 5 ms for more records (what the Kafka how-to
  recommends for dispatchers, and the other rows use): the records of a round then go
  out in several small requests, each costing librdkafka's broker thread CPU;
- Dispatcher -> memory: the same drivers with the in-memory publisher, each one's own
  ceiling on this server;
- live: commit-to-publish latency of lone entries (one commit every 100 ms while the
  dispatcher follows the stream), to Kafka with ``linger.ms`` 5 and 0,
  and to memory (the dispatcher's own latency: its change-stream poll).

The raw loops and the lone publisher run at 10 entries per aggregate only (their records
differ only by key between densities).

The broker is ``scripts/servers.sh start-kafka``'s (or ``$DOCOUTBOX_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from confluent_kafka import Producer

from benchmarks.common import (
    Scale,
    Table,
    add_ceiling_rows,
    connect,
    cpu_medians,
    interleaved,
    median,
    percentile,
)
from benchmarks.dispatch import (
    TIMEOUT,
    DispatchReader,
    TimedPublisher,
    Workbench,
    backlog,
    live,
    timed_drain,
)
from benchmarks.servers import Topics, kafka_available, kafka_bootstrap
from docoutbox import OutboxMessage
from docoutbox.codec import encode_entry
from docoutbox_kafka import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_kafka.publisher import DEFAULTS, REQUIRED
from docoutbox_kafka.records import headers_for

DENSITIES = (1, 10)
THREADS = 4
ROUNDS = 5
#: The dispatchers compared at every density (the raw loop is the baseline).
KINDS = ["threads", "async", "threads-linger0", "async-linger0", "threads-memory", "async-memory"]
#: ``linger.ms`` of the dispatchers' publisher, but for the ``-linger0`` kinds.
LINGER_MS = 5
#: Lone entries per live round, committed ``LIVE_PACE`` a second.
LIVE_ENTRIES = 40
LIVE_PACE = 10.0


class CountingKafka(KafkaPublisher):
    """The Kafka publisher, noting each confirmed entry (and when) in ``stamps``."""

    def __init__(self, config: str | dict[str, Any], topic: str, stamps: TimedPublisher) -> None:
        super().__init__(config, topic)
        self.stamps = stamps

    def publish(self, entry: OutboxMessage) -> None:
        super().publish(entry)
        self.stamps.publish(entry)

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        outcomes = super().publish_many(entries)
        for entry, outcome in zip(entries, outcomes, strict=True):
            if outcome is None:
                self.stamps.publish(entry)
        return outcomes


class CountingAsyncKafka(AsyncKafkaPublisher):
    """The asyncio Kafka publisher, noting each confirmed entry (and when) in ``stamps``."""

    def __init__(self, config: str | dict[str, Any], topic: str, stamps: TimedPublisher) -> None:
        super().__init__(config, topic)
        self.stamps = stamps

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        outcomes = await super().publish_many(entries)
        for entry, outcome in zip(entries, outcomes, strict=True):
            if outcome is None:
                self.stamps.publish(entry)
        return outcomes


def _producer(bootstrap: str, topic: str) -> Any:
    """A connected producer: one record delivered already, so no variant times the
    connection and the idempotent producer's ID request."""

    producer = Producer({**DEFAULTS, "bootstrap.servers": bootstrap, **REQUIRED})
    _warm(producer, topic)
    return producer


def _warm(producer: Any, topic: str) -> None:
    producer.produce(topic, b"warm-up", b"warm-up")
    assert producer.flush(TIMEOUT) == 0


def raw_loop(
    bootstrap: str, topic: str, entries: list[OutboxMessage], cpu: list[float] | None = None
) -> float:
    producer = _producer(bootstrap, topic)
    cpu_began = time.process_time()
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
    rate = len(entries) / (time.perf_counter() - began)
    _cpu(cpu, cpu_began, len(entries))
    assert left == 0, f"{left} records undelivered"
    return rate


def _cpu(cpu: list[float] | None, began: float, count: int) -> None:
    """Note in ``cpu`` the client CPU per record in µs since ``began`` (process time)."""
    if cpu is not None:
        cpu.append((time.process_time() - began) / count * 1e6)


def raw_one_by_one(
    bootstrap: str, topic: str, entries: list[OutboxMessage], cpu: list[float] | None = None
) -> float:
    producer = _producer(bootstrap, topic)
    cpu_began = time.process_time()
    began = time.perf_counter()
    for entry in entries:
        producer.produce(
            topic, encode_entry(entry), str(entry.aggregate_id).encode(),
            headers=headers_for(entry),
        )  # fmt: skip
        assert producer.flush(TIMEOUT) == 0
    rate = len(entries) / (time.perf_counter() - began)
    _cpu(cpu, cpu_began, len(entries))
    return rate


def publisher_threads(
    bootstrap: str, topic: str, entries: list[OutboxMessage], cpu: list[float] | None = None
) -> float:
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
    cpu_began = time.process_time()
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = len(entries) / (time.perf_counter() - began)
    _cpu(cpu, cpu_began, len(entries))
    publisher.close()
    assert not errors, errors
    return rate


class KafkaDispatch(DispatchReader):
    """The benchmark's dispatcher (as :class:`DispatchReader`), publishing to Kafka through
    a producer connected before timing starts."""

    def __init__(
        self, bench: Workbench, kind: str, bootstrap: str, topic: str, linger_ms: int | None = None
    ) -> None:
        self.config: str | dict[str, Any] = bootstrap
        if linger_ms is not None:
            self.config = {"bootstrap.servers": bootstrap, "linger.ms": linger_ms}
        self.topic = topic
        self.sync: CountingKafka | None = None
        super().__init__(bench, kind)

    def _sync_publisher(self) -> Any:
        self.sync = CountingKafka(self.config, self.topic, self.publisher)
        _warm(self.sync._current(), self.topic)
        return self.sync

    def _async_publisher(self) -> Any:
        publisher = CountingAsyncKafka(self.config, self.topic, self.publisher)
        _warm(publisher.sync._current(), self.topic)
        return publisher

    async def _close_async(self, publisher: Any) -> None:
        await publisher.close()

    def finish(self) -> None:
        super().finish()
        if self.sync is not None:
            self.sync.close()


def dispatcher(
    client: Any,
    bootstrap: str,
    topic: str,
    entries: int,
    density: int,
    kind: str,
    sink: list[OutboxMessage] | None = None,
    cpu: list[float] | None = None,
) -> float:
    """Dispatch ``entries`` fresh commits with the ``kind`` driver (one of :data:`KINDS`);
    a given ``sink`` receives what was published, a given ``cpu`` the client CPU per
    entry in µs."""
    reader = _reader(backlog(client, entries, density), kind, bootstrap, topic)
    rate = timed_drain(reader, entries, cpu)
    if sink is not None:
        sink.extend(reader.publisher.published)
    return rate


def _reader(bench: Workbench, kind: str, bootstrap: str, topic: str) -> DispatchReader:
    """The dispatcher of ``kind`` (one of :data:`KINDS`) over ``bench``."""
    driver = "async" if kind.startswith("async") else "dispatcher"
    if kind.endswith("memory"):
        return DispatchReader(bench, driver)
    linger = None if kind.endswith("linger0") else LINGER_MS
    return KafkaDispatch(bench, driver, bootstrap, topic, linger)


def latencies(client: Any, bootstrap: str, topic: str, rounds: int) -> dict[str, list[list[float]]]:
    """Commit-to-publish latencies (s) of lone entries, per kind and round, interleaved."""
    found: dict[str, list[list[float]]] = {kind: [] for kind in KINDS}
    for index in range(rounds):
        shift = index % len(KINDS)
        for kind in KINDS[shift:] + KINDS[:shift]:
            reader = partial(_reader, bootstrap=bootstrap, topic=topic)
            found[kind].append(live(client, LIVE_ENTRIES, LIVE_PACE, kind, reader))
    return found


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
    samples: dict[int, dict[str, list[float]]] = {}
    cpu: dict[int, dict[str, list[float]]] = {}
    try:
        topic = topics.create(f"bench-{uuid.uuid4().hex[:6]}", partitions=4)
        # Live rounds first, on a small oplog (every read of the wire server scans it).
        lone = latencies(client, bootstrap, topic, rounds)
        for density in DENSITIES:
            records: list[OutboxMessage] = []
            # The records, and a warm-up of the broker, the server and the dispatcher.
            dispatcher(client, bootstrap, topic, entries, density, "async", records)
            assert len(records) == entries, (len(records), entries)
            used = cpu[density] = {name: [] for name in LABELS}
            plan: dict[str, Callable[[], float]] = {
                "raw": partial(raw_loop, bootstrap, topic, records, used["raw"])
            }
            if density == max(DENSITIES):
                quarter = records[: entries // 4]
                plan["one-by-one"] = partial(
                    raw_one_by_one, bootstrap, topic, quarter, used["one-by-one"]
                )
                plan["publisher"] = partial(
                    publisher_threads, bootstrap, topic, records, used["publisher"]
                )
            for kind in KINDS:
                plan[kind] = partial(
                    dispatcher, client, bootstrap, topic, entries, density, kind, cpu=used[kind]
                )
            samples[density] = interleaved(plan, rounds, scale.warmup)
    finally:
        topics.close()
        client.drop_database("docoutbox_bench")
        client.close()
    warmup = scale.warmup
    used_cpu = {d: cpu_medians({k: v for k, v in c.items() if v}, warmup) for d, c in cpu.items()}
    return _table(samples, used_cpu, entries, rounds, lone)


LABELS = {
    "raw": "raw confluent-kafka produce loop, one flush",
    "one-by-one": "raw produce + flush, one record at a time",
    "publisher": f"KafkaPublisher, {THREADS} threads (no database)",
    "threads": f"Dispatcher (threads) -> KafkaPublisher, linger.ms={LINGER_MS}",
    "async": f"AsyncDispatcher -> AsyncKafkaPublisher, linger.ms={LINGER_MS}",
    "threads-linger0": "Dispatcher (threads) -> KafkaPublisher, linger.ms=0 (default)",
    "async-linger0": "AsyncDispatcher -> AsyncKafkaPublisher, linger.ms=0 (default)",
    "threads-memory": "Dispatcher (threads) -> memory",
    "async-memory": "AsyncDispatcher -> memory",
}
#: Each dispatcher's ceiling on this server: the same driver publishing to memory.
MEMORY = {
    "threads": "threads-memory",
    "async": "async-memory",
    "threads-linger0": "threads-memory",
    "async-linger0": "async-memory",
}


def _table(
    samples: dict[int, dict[str, list[float]]],
    cpu: dict[int, dict[str, float]],
    entries: int,
    rounds: int,
    lone: dict[str, list[list[float]]],
) -> Table:
    table = Table(
        "kafka",
        "Dispatch throughput to Kafka vs a raw confluent-kafka produce loop of the same records",
        [
            "entries per aggregate",
            "variant",
            "records/s",
            "vs raw loop",
            "vs same driver -> memory",
            "vs the lower ceiling",
            "additive bound",
            "client CPU µs/record",
        ],
    )
    add_ceiling_rows(table, samples, cpu, LABELS, MEMORY, digits=3)
    live_ms = {
        kind: {
            "p50_ms": median([percentile(run, 50) for run in runs]) * 1000,
            "p99_ms": median([percentile(run, 99) for run in runs]) * 1000,
        }
        for kind, runs in lone.items()
    }
    table.figures["live"] = live_ms
    table.notes += [
        f"{entries:,} records per round (one entry per commit, 1 or 10 pending entries per "
        "aggregate: the aggregates are the record keys) on a 4-partition topic of a "
        f"single-node KRaft broker on the same machine, {rounds} interleaved rounds per "
        "density after a warm-up; producers are idempotent with acks=all, the "
        f"dispatchers' publisher has linger.ms {LINGER_MS} unless a row says 0 (the "
        "publisher's default, which the lone publisher rows use), and is connected (one "
        "record delivered) before timing starts. "
        "'one-by-one' runs a quarter of the records. Ratios are medians over rounds of the "
        "per-round ratio (interquartile range, or min-max below 4 rounds, in brackets); "
        "'vs the lower ceiling' divides by the lower of the raw loop and the same driver "
        "-> memory in the same round (the goal is >= 0.8x); 'additive bound' is what "
        "adding the two ceilings' costs per entry on one interpreter allows: "
        "1/(1/raw + 1/memory) over the lower one.",
        "'client CPU' is this process's CPU time (every thread, librdkafka's included) per "
        "record over the timed span, median over rounds: the database and the broker run "
        "apart.",
        "Every dispatcher round checks that each entry was published and trimmed; the raw "
        "loops check that every record was delivered.",
        f"live, commit-to-publish of lone entries ({LIVE_ENTRIES} commits at "
        f"{LIVE_PACE:.0f}/s per round, {rounds} interleaved rounds, medians of each round's "
        "p50 / p99 in ms): "
        + "; ".join(
            f"{LABELS[kind]} {ms['p50_ms']:.1f} / {ms['p99_ms']:.1f}"
            for kind, ms in live_ms.items()
        )
        + ".",
    ]
    return table
