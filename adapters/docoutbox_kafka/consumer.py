"""Consume outbox entries from Kafka into an aggregate store, committing offsets after commit.

Rule: a partition's committed offset never passes a record that was neither handled
(committed to the store, or recognized as a duplicate) nor written to the dead-letter topic.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka import Message as Record
from pydantic import BaseModel

from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
from docoutbox.receive import Action, Verdict, describe, receive
from docoutbox.store.api import AggregateStore
from docoutbox_kafka.errors import translate_error, translated
from docoutbox_kafka.publisher import DEFAULTS as PRODUCER_DEFAULTS
from docoutbox_kafka.publisher import REQUIRED as PRODUCER_REQUIRED
from docoutbox_kafka.records import (
    Headers,
    ReceivedHeaders,
    masked_config,
    received_headers,
)

S = TypeVar("S", bound=BaseModel)
log = logging.getLogger("docoutbox.kafka")

#: Settings the consumer's guarantees rest on; ``config`` cannot override them.
REQUIRED: Mapping[str, Any] = {
    "enable.auto.commit": False,  # offsets are committed here, after the store's commit
    "enable.auto.offset.store": False,
}
DEFAULTS: Mapping[str, Any] = {
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
}

#: Headers added to a dead-lettered record, next to the original key, value and headers.
ERROR_HEADER = "docoutbox-error"
TOPIC_HEADER = "docoutbox-topic"
PARTITION_HEADER = "docoutbox-partition"
OFFSET_HEADER = "docoutbox-offset"
GROUP_HEADER = "docoutbox-group"


@dataclass
class ConsumerStats:
    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    #: Records read again from the same offset after a retryable failure.
    retried: int = 0
    dead_lettered: int = 0
    #: Records this consumer had already read once (after a retry); Kafka keeps no
    #: delivery count, so records read again after a restart are not counted.
    redelivered: int = 0
    commits: int = 0


class KafkaConsumer(Generic[S]):
    """Feed records of ``topics`` to ``store.handle`` and commit offsets only after the commit.

    Each value is an entry (:func:`docoutbox.codec.decode_message`: plain docoutbox JSON,
    or a CloudEvent in structured or binary mode); its message carries
    ``source`` and ``seq``, so exact de-duplication (``InboxPolicy(exact=True)``) spots
    the records a restart reads again. A record is handled on the aggregate
    ``aggregate_id_of(message)`` and settled as
    :func:`docoutbox.receive.receive` decides:

    - acked: its offset becomes committable (committed every ``commit_every`` records,
      every ``commit_interval`` seconds, when partitions are revoked and on stop);
    - requeued (a transient store error, a conflict, gave up): the partition is rewound
      to the record, which is read again after ``requeue_delay``; later records of that
      partition wait, so per-partition order holds;
    - rejected (not a valid message, invalid input, a handler error): the record is
      written to ``dead_letter_topic`` with its error in the ``docoutbox-error`` header,
      and only once the broker confirmed that does its offset become committable;
    - a permanent store error rewinds the partition, commits what was done and raises.

    Like any confluent-kafka consumer, an instance belongs to one thread; run several
    (same ``group``) for parallelism: Kafka gives each a share of the partitions.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        topics: Sequence[str] | str,
        group: str,
        store: AggregateStore[S],
        handler: Handler[S],
        *,
        aggregate_id_of: Callable[[Message], AggregateId],
        dead_letter_topic: str,
        create: bool = False,
        requeue_delay: float = 0.05,
        commit_every: int = 100,
        commit_interval: float = 1.0,
        on_verdict: Callable[[Verdict, Record], None] | None = None,
    ) -> None:
        settings = {"bootstrap.servers": config} if isinstance(config, str) else dict(config)
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.group = group
        self.store = store
        self.handler = handler
        self.aggregate_id_of = aggregate_id_of
        self.dead_letter_topic = dead_letter_topic
        self.create = create
        self.requeue_delay = requeue_delay
        self.commit_every = commit_every
        self.commit_interval = commit_interval
        self.on_verdict = on_verdict
        self.stats = ConsumerStats()
        self._settings = {**DEFAULTS, **settings, **REQUIRED, "group.id": group}
        self._settings.setdefault("client.id", f"docoutbox-consumer-{uuid.uuid4().hex[:6]}")
        producer = {
            k: v for k, v in settings.items() if not k.startswith(("group.", "auto.", "enable."))
        }
        self._producer_settings = {**PRODUCER_DEFAULTS, **producer, **PRODUCER_REQUIRED}
        self._dead_letter_timeout = float(self._producer_settings["message.timeout.ms"]) / 1000
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        #: Per partition, the next offset to commit (every record before it is settled).
        self._done: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._seen: dict[tuple[str, int], int] = {}
        #: Per partition rewound by a retry, the offset it was rewound to: records after it
        #: that were fetched before the rewind are skipped until it comes again.
        self._rewound: dict[tuple[str, int], int] = {}
        self._since_commit = 0
        self._committed_at = time.monotonic()

    def __repr__(self) -> str:
        servers = masked_config(self._settings).get("bootstrap.servers")
        return f"<KafkaConsumer {servers} topics={self.topics} group={self.group!r}>"

    def decide(self, value: bytes | None, headers: ReceivedHeaders = None) -> Verdict:
        """Handle one record (value and headers) against the store and decide how to settle
        it. No I/O to the broker. The value may be plain docoutbox JSON or a CloudEvent,
        structured or binary (then its attributes are ``ce_`` headers)."""
        text = received_headers(headers)
        return receive(
            value or b"",
            self.store,
            self.handler,
            self.aggregate_id_of,
            create=self.create,
            headers=text,
            content_type=text.get("content-type"),
        )

    def run(
        self,
        *,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
        poll: float = 0.1,
    ) -> ConsumerStats:
        """Consume until ``max_messages`` records, ``idle_timeout`` seconds without one, or
        ``stop`` is set; then commit what was settled. Raises ``BrokerUnavailable`` if
        the cluster fails (uncommitted records come again), a dead-letter write's error,
        and a permanent store error after rewinding its record.
        """
        consumer = self._open()
        count = 0
        idle_since = time.monotonic()
        try:
            while True:
                record = consumer.poll(poll)
                if record is None or self._skip(record) or self._stale(record):
                    stopped = stop is not None and stop.is_set()
                    idle = idle_timeout is not None and (
                        time.monotonic() - idle_since >= idle_timeout
                    )
                    if stopped or idle:
                        break
                    self._maybe_commit()
                    continue
                verdict = self.decide(record.value(), record.headers())
                self._settle(consumer, record, verdict)
                count += 1
                idle_since = time.monotonic()
                self._maybe_commit()
                if (max_messages is not None and count >= max_messages) or (
                    stop is not None and stop.is_set()
                ):
                    break
        finally:
            self.commit()
        return self.stats

    def commit(self) -> None:
        """Commit the offsets of every settled record (synchronously)."""
        consumer = self._consumer
        offsets = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in self._done.items()
            if self._committed.get((topic, partition)) != offset
        ]
        if consumer is None or not offsets:
            return
        with translated(f"commit offsets of group {self.group!r}"):
            consumer.commit(offsets=offsets, asynchronous=False)
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset
        self.stats.commits += 1
        self._since_commit = 0
        self._committed_at = time.monotonic()

    def close(self) -> None:
        """Commit what was settled and leave the group."""
        try:
            self.commit()
        finally:
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                consumer.close()
            producer, self._producer = self._producer, None
            if producer is not None:
                producer.flush(10)

    def _open(self) -> Consumer:
        if self._consumer is None:
            with translated(f"create a Kafka consumer for group {self.group!r}"):
                consumer = Consumer(self._settings, logger=log)
                consumer.subscribe(self.topics, on_revoke=self._on_revoke)
            self._consumer = consumer
        return self._consumer

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what was settled on partitions handed to another member, then forget them."""
        try:
            self.commit()
        except Exception as exc:  # noqa: BLE001 - the records come again: duplicates, no loss
            log.warning("could not commit before a rebalance: %s", exc)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._done.pop(key, None)
            self._committed.pop(key, None)
            self._seen.pop(key, None)
            self._rewound.pop(key, None)

    def _skip(self, record: Record) -> bool:
        """True for a poll result that is an event, not a record; raise if it is fatal."""
        error = record.error()
        if error is None:
            return False
        if error.fatal():
            raise translate_error(error, f"consume {self.topics} as group {self.group!r}")
        if error.code() != KafkaError._PARTITION_EOF:
            log.warning("Kafka consumer: %s", error.str())
        return True

    def _stale(self, record: Record) -> bool:
        """True for a record after a rewound offset, fetched before the rewind."""
        key = (str(record.topic()), int(record.partition() or 0))
        rewound = self._rewound.get(key)
        if rewound is None:
            return False
        if record.offset() == rewound:
            del self._rewound[key]
            return False
        return True

    def _rewind(self, consumer: Consumer, topic: str, partition: int, offset: int) -> None:
        with translated(f"rewind {topic}[{partition}] to {offset}"):
            consumer.seek(TopicPartition(topic, partition, offset))
        self._rewound[(topic, partition)] = offset

    def _settle(self, consumer: Consumer, record: Record, verdict: Verdict) -> None:
        stats, topic, partition, offset = (
            self.stats,
            record.topic(),
            record.partition(),
            record.offset(),
        )
        assert topic is not None and partition is not None and offset is not None
        key = (topic, partition)
        stats.delivered += 1
        redelivered = offset <= self._seen.get(key, -1)
        stats.redelivered += redelivered
        self._seen[key] = max(offset, self._seen.get(key, -1))
        if verdict.action is Action.ACK:
            if verdict.outcome is not None and verdict.outcome.duplicate:
                stats.duplicates += 1
            else:
                stats.applied += 1
            self._mark_done(key, offset)
        elif verdict.action is Action.REQUEUE:
            log.warning("reading again %s", describe(verdict))
            self._rewind(consumer, topic, partition, offset)
            stats.retried += 1
            if verdict.fatal and verdict.error is not None:
                self._report(verdict, record)
                raise verdict.error
            time.sleep(self.requeue_delay)
        else:
            try:
                self._dead_letter(record, verdict)
            except BaseException:
                self._rewind(consumer, topic, partition, offset)
                raise
            stats.dead_lettered += 1
            self._mark_done(key, offset)
        self._report(verdict, record)

    def _report(self, verdict: Verdict, record: Record) -> None:
        if self.on_verdict is not None:
            self.on_verdict(verdict, record)

    def _mark_done(self, key: tuple[str, int], offset: int) -> None:
        self._done[key] = offset + 1
        self._since_commit += 1

    def _maybe_commit(self) -> None:
        if self._since_commit >= self.commit_every or (
            self._since_commit and time.monotonic() - self._committed_at >= self.commit_interval
        ):
            self.commit()

    def _dead_letter(self, record: Record, verdict: Verdict) -> None:
        """Write the record to the dead-letter topic with its error; return once confirmed."""
        log.error(
            "dead-lettering %s (record %s[%s]@%s)",
            describe(verdict),
            record.topic(),
            record.partition(),
            record.offset(),
            exc_info=verdict.error,
        )
        error = verdict.error
        reason = f"{type(error).__name__}: {error}" if error is not None else describe(verdict)
        headers: Headers = [(str(pair[0]), pair[1]) for pair in record.headers() or []]
        headers += [
            (ERROR_HEADER, reason[:4000].encode()),
            (TOPIC_HEADER, str(record.topic()).encode()),
            (PARTITION_HEADER, str(record.partition()).encode()),
            (OFFSET_HEADER, str(record.offset()).encode()),
            (GROUP_HEADER, self.group.encode()),
        ]
        what = f"dead-letter record {record.topic()}[{record.partition()}]@{record.offset()}"
        if self._producer is None:
            with translated("create the dead-letter producer"):
                self._producer = Producer(self._producer_settings, logger=log)
        failures: list[KafkaError] = []

        def reported(err: KafkaError | None, _: Record) -> None:
            if err is not None:
                failures.append(err)

        with translated(what):
            self._producer.produce(
                self.dead_letter_topic,
                record.value(),
                record.key(),
                headers=headers,
                on_delivery=reported,
            )
            if self._producer.flush(self._dead_letter_timeout + 30) > 0:
                failures.append(KafkaError(KafkaError._MSG_TIMED_OUT))
        if failures:
            raise translate_error(failures[0], what)
