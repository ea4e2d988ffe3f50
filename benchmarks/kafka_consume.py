"""Benchmark: Kafka consumer throughput with ``handle_batch`` against one write per record.

The same records (docoutbox entries, key = producing aggregate) are consumed from a
4-partition topic into a fresh collection of the wire server, exact de-duplication
(``InboxPolicy(exact=True)``), in the same run:

- per record (baseline): ``KafkaConsumer(batch=False)``, one ``store.handle`` (one load
  and one conditional write) per record, offsets committed after the writes;
- handle_batch: ``KafkaConsumer`` (default), a poll's records of one aggregate handled in
  one ``handle_batch`` (one write);

for two workloads: few hot aggregates (100 records each) and many (10 records each), so a
poll holds many or few records per aggregate. Each round uses a new consumer group and a
new collection; the group is joined (one record read) before timing starts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import Producer

from benchmarks.common import (
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    ratio_range,
    timed_rate,
)
from benchmarks.kafka import broker
from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from benchmarks.servers import Topics
from docoutbox import AggregateStore, InboxPolicy, StoreConfig
from docoutbox.codec import encode_entry
from docoutbox_kafka import KafkaConsumer
from docoutbox_kafka.publisher import DEFAULTS, REQUIRED
from docoutbox_kafka.records import headers_for
from docoutbox_mongo import MongoBackend

ROUNDS = 3
#: Records per aggregate in each workload.
DENSITIES = {"hot": 100, "spread": 10}
EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))


def fill(bootstrap: str, topic: str, records: int, density: int) -> None:
    """Produce ``records`` entries, ``density`` per aggregate, interleaved by seq."""

    producer = Producer({**DEFAULTS, "bootstrap.servers": bootstrap, **REQUIRED})
    aggregates = max(1, records // density)
    for seq in range(1, density + 1):
        for index in range(aggregates):
            entry = make_entry(f"p{index}", seq)
            key = str(entry.aggregate_id).encode()
            producer.produce(topic, encode_entry(entry), key, headers=headers_for(entry))
    assert producer.flush(60) == 0


def consume(client: Any, bootstrap: str, topic: str, records: int, batch: bool) -> float:
    """Records per second of one consumer reading the whole topic, after joining."""
    store = AggregateStore(MongoBackend(new_collection(client, "kafka_consume")), Ledger, EXACT)
    consumer = KafkaConsumer(
        bootstrap,
        topic,
        f"bench-{uuid.uuid4().hex[:8]}",
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        dead_letter_topic=f"{topic}-dead",
        create=True,
        batch=batch,
    )
    try:
        consumer.run(max_messages=1, idle_timeout=30)  # join the group: not timed
        rate = timed_rate(
            records - 1, lambda: consumer.run(max_messages=records - 1, idle_timeout=30)
        )
        stats = consumer.stats
        assert (stats.applied, stats.dead_lettered) == (records, 0), stats
    finally:
        consumer.close()
    return rate


def run(uri: str, scale: Scale) -> Table:
    bootstrap = broker()
    client = connect(uri)
    topics = Topics(bootstrap)
    records = scale.dispatch_entries
    rounds = min(scale.rounds, ROUNDS)
    plan: dict[str, Callable[[], float]] = {}
    try:
        for name, density in DENSITIES.items():
            topic = topics.create(f"bench-consume-{name}", partitions=4)
            fill(bootstrap, topic, records, min(density, records))
            plan[f"{name}/per-record"] = partial(consume, client, bootstrap, topic, records, False)
            plan[f"{name}/batch"] = partial(consume, client, bootstrap, topic, records, True)
        samples = interleaved(plan, rounds, scale.warmup)
    finally:
        topics.close()
        client.drop_database("docoutbox_bench")
        client.close()
    return _table(samples, records)


def _table(samples: dict[str, list[float]], records: int) -> Table:
    table = Table(
        "kafka_consume",
        "Kafka consumer throughput: handle_batch per aggregate vs one write per record",
        ["workload", "variant", "records/s", "vs per record"],
    )
    for name, density in DENSITIES.items():
        base = samples[f"{name}/per-record"]
        for variant in ("per-record", "batch"):
            got = samples[f"{name}/{variant}"]
            low, high = ratio_range(got, base)
            ratio = paired_ratio(got, base)
            label = f"{density} records/aggregate"
            table.add(label, variant, median(got), f"{ratio:.2f}x ({low:.2f}-{high:.2f})")
            table.figures[f"{name}/{variant}"] = {"per_s": median(got), "ratio": ratio}
    table.notes += [
        f"{records:,} records per round on a 4-partition topic of a single-node KRaft broker, "
        "consumed into a fresh collection of the wire server (exact de-duplication); polls "
        "of up to 500 records; a new group per round, joined before timing starts. Ratios "
        "are medians over rounds of the per-round ratio (min-max below 4 rounds).",
    ]
    return table
