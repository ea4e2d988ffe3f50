"""KafkaConsumer's offset rule with a scripted consumer (no broker): never commit past a
record that was neither handled nor dead-lettered, even when records fetched before a
rewind are delivered after it."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from docoutbox import AggregateStore, InboxPolicy, StoreConfig
from docoutbox.codec import encode_entry
from docoutbox.retry import RetryPolicy
from docoutbox_kafka import KafkaConsumer
from tests.support.consumers import Record
from tests.support.e2e import FaultyBackend


class ScriptedConsumer:
    """Returns the scripted records in order, then nothing; records seeks and commits."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.seeks: list[int] = []
        self.commits: list[int] = []

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        return [self.records.pop(0)] if self.records else []

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append(tp.offset)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits += [tp.offset for tp in offsets]


def test_records_fetched_before_a_rewind_are_skipped_until_it_comes_again() -> None:
    first, second = make_entry("a", 1), make_entry("a", 2)
    r0, r1 = Record(0, encode_entry(first)), Record(1, encode_entry(second))
    # r0 fails once (the store gives up), so the partition is rewound to 0; r1, fetched
    # before the rewind, is delivered anyway; then the fetch restarts at 0.
    scripted = ScriptedConsumer([r0, r1, r0, r1])
    backend = FaultyBackend()
    backend.refuse_writes = 1
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True), retry=RetryPolicy(1))
    consumer: KafkaConsumer[Any] = KafkaConsumer(
        "unused:9092",
        "t",
        "g",
        AggregateStore(backend, Ledger, config),
        ledger_handlers,
        aggregate_id_of=by_source,
        dead_letter_topic="dead",
        create=True,
        requeue_delay=0,
        commit_every=1,
    )
    consumer._consumer = scripted  # type: ignore[assignment]
    stats = consumer.run(idle_timeout=0.05, poll=0.01)
    assert scripted.seeks == [0]
    assert (stats.requeued, stats.applied) == (1, 2)
    assert scripted.commits == [1, 2]  # never 2 before seq 1 was handled
    snapshot = AggregateStore(backend, Ledger).get("Producer/a")
    assert snapshot.state.seqs["Producer/a"] == [1, 2]
