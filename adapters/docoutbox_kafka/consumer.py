"""Consume outbox entries from Kafka into an aggregate store, committing offsets after commit.

Rule: a partition's committed offset never passes a record that was neither handled
(committed to the store, or recognized as a duplicate) nor kept in the dead letters
(:mod:`docoutbox_kafka.offsets`). A poll's records are handled as
:func:`docoutbox.receive.receive_flow` decides: several records of one aggregate in one
``handle_batch`` write, failing handlers retried, rejects kept; only then are offsets
committed. :class:`KafkaConsumer` (threads) and
:class:`~docoutbox_kafka.aio.AsyncKafkaConsumer` (asyncio) share :class:`KafkaSettlement`.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka import Message as Record
from pydantic import BaseModel

from docoutbox import receive
from docoutbox.errors import InvalidConfig
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message
from docoutbox.receive import (
    Action,
    Delivery,
    HandlerRetry,
    KeptReceiver,
    Options,
    Receiver,
    Rejects,
    Verdict,
    creating_types,
    describe,
    keep_sync,
    log_rejection,
    summary,
)
from docoutbox.store.api import AggregateStore
from docoutbox_kafka.errors import translate_error, translated
from docoutbox_kafka.offsets import Offsets, Settled
from docoutbox_kafka.publisher import DEFAULTS as PRODUCER_DEFAULTS
from docoutbox_kafka.publisher import REQUIRED as PRODUCER_REQUIRED
from docoutbox_kafka.records import (
    Headers,
    client_settings,
    masked_config,
    received_headers,
)

S = TypeVar("S", bound=BaseModel)
St = TypeVar("St")
R = TypeVar("R")
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
class ConsumerStats(receive.ConsumerStats):
    """:class:`docoutbox.receive.ConsumerStats` plus offset commits. ``requeued`` counts
    records read again from the same offset; ``redelivered`` the records this consumer
    had read once already (Kafka keeps no delivery count, so records read again after a
    restart are not counted)."""

    commits: int = 0


#: The settings a consumer's receiver is built from: setting one drops the receiver, and
#: the next poll builds it again.
RECEIVER_SETTINGS = frozenset(
    {"store", "handler", "aggregate_id_of", "create", "creates", "retry", "batch", "_sleep"}
)


class KafkaSettlement(KeptReceiver, Generic[St, R]):
    """What the sync and asyncio Kafka consumers share: settings, offsets, dead-letter
    records, counts and logs (no I/O but the dead-letter topic's producer).

    What handles a poll's records (the receive flow's options and its receiver) is built
    at the first poll that brings records and kept for the next ones, not built again
    for each: setting one of :data:`RECEIVER_SETTINGS` drops it. Each poll passes its
    own ``keep`` (it knows the poll's records).
    """

    receiver_settings = RECEIVER_SETTINGS

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        topics: Sequence[str] | str,
        group: str,
        store: St,
        handler: Handler[Any],
        *,
        aggregate_id_of: Callable[[Message], AggregateId],
        dead_letter_topic: str | None = None,
        dead_letters: R | None = None,
        create: bool = False,
        creates: Iterable[str] = (),
        batch: bool = True,
        max_batch: int = 500,
        retry: HandlerRetry | None = None,
        requeue_delay: float = 0.05,
        commit_every: int = 100,
        commit_interval: float = 1.0,
        on_verdict: Callable[[Verdict, Record], None] | None = None,
    ) -> None:
        if dead_letter_topic is None and dead_letters is None:
            raise InvalidConfig(
                "a Kafka consumer needs dead_letter_topic or dead_letters: a rejected record "
                "must be kept somewhere before its offset is committed"
            )
        if max_batch < 1:
            raise InvalidConfig(f"max_batch must be at least 1, got {max_batch}")
        settings = client_settings(config)
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.group = group
        self.store = store
        self.handler = handler
        self.aggregate_id_of = aggregate_id_of
        self.dead_letter_topic = dead_letter_topic
        self.dead_letters = dead_letters
        self.create = create
        self.creates = creating_types(creates)
        self.batch = batch
        self.max_batch = max_batch
        self.retry = retry if retry is not None else HandlerRetry()
        self.requeue_delay = requeue_delay
        self.on_verdict = on_verdict
        self.stats = ConsumerStats()
        self.offsets = Offsets(commit_every, commit_interval)
        self._settings = {**DEFAULTS, **settings, **REQUIRED, "group.id": group}
        self._settings.setdefault("client.id", f"docoutbox-consumer-{uuid.uuid4().hex[:6]}")
        producer = {
            k: v for k, v in settings.items() if not k.startswith(("group.", "auto.", "enable."))
        }
        self._producer_settings = {**PRODUCER_DEFAULTS, **producer, **PRODUCER_REQUIRED}
        self._dead_letter_timeout = float(self._producer_settings["message.timeout.ms"]) / 1000
        self._producer: Producer | None = None

    def __repr__(self) -> str:
        servers = masked_config(self._settings).get("bootstrap.servers")
        return f"<{type(self).__name__} {servers} topics={self.topics} group={self.group!r}>"

    def _options(self) -> Options:
        return Options(self.create, self.retry, batch=self.batch, keep=True, creates=self.creates)

    def _want(self, count: int, max_messages: int | None) -> int:
        return self.max_batch if max_messages is None else min(self.max_batch, max_messages - count)

    @staticmethod
    def _stopping(stop: Any, max_messages: int | None, count: int) -> bool:
        return (max_messages is not None and count >= max_messages) or (
            stop is not None and stop.is_set()
        )

    def _usable(self, polled: Sequence[Record]) -> list[Record]:
        """The records of a poll to handle: not events, not fetched before a rewind."""
        return [r for r in polled if not self._skip(r) and self.offsets.fresh(r)]

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

    @staticmethod
    def _deliveries(records: Sequence[Record]) -> list[Delivery]:
        deliveries = []
        for record in records:
            text = received_headers(record.headers())
            deliveries.append(Delivery(record.value() or b"", text, text.get("content-type")))
        return deliveries

    def _settle(self, records: Sequence[Record], verdicts: Sequence[Verdict]) -> Settled:
        """Advance the offsets and count and log every record; the shell then rewinds."""
        settled = self.offsets.settle(records, verdicts)
        for record, verdict, again in zip(records, verdicts, settled.redelivered, strict=True):
            self.stats.count(verdict, again)
            if verdict.action is Action.REQUEUE:
                log.warning("reading again %s", summary(verdict, record.value() or b""))
            if self.on_verdict is not None:
                self.on_verdict(verdict, record)
        return settled

    def _committing(self, offsets: list[tuple[str, int, int]]) -> list[TopicPartition]:
        return [TopicPartition(topic, partition, offset) for topic, partition, offset in offsets]

    def _committed(self, offsets: list[tuple[str, int, int]]) -> None:
        self.offsets.mark_committed(offsets)
        self.stats.commits += 1

    def _dead_letter(self, record: Record, verdict: Verdict) -> None:
        """Keep a rejected record: in the dead-letter topic (returning once the broker
        confirmed it) and in ``dead_letters``. Blocking: the async consumer runs it in a
        worker thread."""
        where = f"record {record.topic()}[{record.partition()}]@{record.offset()}"
        log_rejection(log, verdict, record.value() or b"", f"dead-lettering ({where})")
        if self.dead_letter_topic is not None:
            self._produce_dead_letter(record, verdict, self.dead_letter_topic)
        if self.dead_letters is not None and not _is_async(self.dead_letters):
            keep_sync(self.dead_letters, verdict, record.value() or b"", self._origin(record))  # type: ignore[arg-type]

    @staticmethod
    def _origin(record: Record) -> str:
        """The ``queue`` a record's dead letter names: ``kafka:<topic>``."""
        return f"kafka:{record.topic()}"

    def _produce_dead_letter(self, record: Record, verdict: Verdict, topic: str) -> None:
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
                topic, record.value(), record.key(), headers=headers, on_delivery=reported
            )
            if self._producer.flush(self._dead_letter_timeout + 30) > 0:
                failures.append(KafkaError(KafkaError._MSG_TIMED_OUT))
        if failures:
            raise translate_error(failures[0], what)

    def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(10)


def _is_async(rejects: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(rejects, "put", None))


class KafkaConsumer(KafkaSettlement[AggregateStore[S], Rejects], Generic[S]):
    """Feed records of ``topics`` to the store and commit offsets only after the commit.

    Each value is an entry (:func:`docoutbox.codec.decode_message`: plain docoutbox JSON,
    or a CloudEvent in structured or binary mode); its message carries ``source`` and
    ``seq``, so exact de-duplication (``InboxPolicy(exact=True)``) spots the records a
    restart reads again. Up to ``max_batch`` records are polled at once; the records of
    one aggregate (``aggregate_id_of(message)``) are handled in order, in one
    ``handle_batch`` write when there are several (``batch=False``: one ``handle`` each).
    Each record is then settled as :func:`docoutbox.receive.receive_flow` decides:

    - acked: its offset becomes committable (committed every ``commit_every`` records,
      every ``commit_interval`` seconds, when partitions are revoked and on stop);
    - requeued (a transient store error, a conflict, gave up): the partition is rewound
      to the record, which is read again after ``requeue_delay``; later records of its
      aggregate wait, and so do later offsets of the partition;
    - rejected (not a valid message, invalid input, a handler still failing after
      ``retry``): the record is written to ``dead_letter_topic`` with its error in the
      ``docoutbox-error`` header and/or stored in ``dead_letters`` (e.g.
      ``MongoDeadLetters``, queue ``kafka:<topic>``), and only once that is done does its
      offset become committable; if that fails, the partition is rewound and the error
      raised;
    - a permanent store error rewinds the partition, commits what was done and raises.

    A record to an aggregate that does not exist yet creates it when its type is in
    ``creates`` (or any type with ``create=True``); otherwise it is NotFound: retried,
    then rejected.

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
        sleep: Callable[[float], None] = time.sleep,
        **options: Any,
    ) -> None:
        super().__init__(config, topics, group, store, handler, **options)
        self._sleep = sleep
        self._consumer: Consumer | None = None

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
                with translated(f"consume {self.topics} as group {self.group!r}"):
                    polled = consumer.consume(self._want(count, max_messages), poll)
                records = self._usable(polled)
                if not records:
                    stopped = stop is not None and stop.is_set()
                    idle = idle_timeout is not None and (
                        time.monotonic() - idle_since >= idle_timeout
                    )
                    if stopped or idle:
                        break
                    self._maybe_commit()
                    continue
                self._handle(consumer, records)
                count += len(records)
                idle_since = time.monotonic()
                self._maybe_commit()
                if self._stopping(stop, max_messages, count):
                    break
        finally:
            self.commit()
        return self.stats

    def _handle(self, consumer: Consumer, records: list[Record]) -> None:
        receiver: Receiver[S] | None = self._receiver
        if receiver is None:
            receiver = self._receiver = Receiver(
                self.store, self.handler, self.aggregate_id_of, self._options(), sleep=self._sleep
            )
        verdicts = receiver.receive(
            self._deliveries(records),
            keep=lambda index, verdict: self._dead_letter(records[index], verdict),
        )
        settled = self._settle(records, verdicts)
        for topic, partition, offset in settled.rewind:
            with translated(f"rewind {topic}[{partition}] to {offset}"):
                consumer.seek(TopicPartition(topic, partition, offset))
        if settled.error is not None:
            raise settled.error
        if settled.rewind:
            self._sleep(self.requeue_delay)

    def commit(self) -> None:
        """Commit the offsets of every settled record (synchronously)."""
        offsets = self.offsets.to_commit()
        if self._consumer is None or not offsets:
            return
        with translated(f"commit offsets of group {self.group!r}"):
            self._consumer.commit(offsets=self._committing(offsets), asynchronous=False)
        self._committed(offsets)

    def close(self) -> None:
        """Commit what was settled and leave the group."""
        try:
            self.commit()
        finally:
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                consumer.close()
            self._close_producer()

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
        self.offsets.forget(partitions)

    def _maybe_commit(self) -> None:
        if self.offsets.due():
            self.commit()
