"""Publish outbox entries to Kafka with the idempotent producer, waiting for delivery reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from docoutbox.codec import WireFormat
from docoutbox.errors import BrokerUnavailable, DocOutboxError, PermanentPublishError
from docoutbox.model import OutboxMessage
from docoutbox_kafka.errors import translate, translate_error, translated
from docoutbox_kafka.records import Headers, client_settings, masked_config, record_for

log = logging.getLogger("docoutbox.kafka")

#: Settings the publisher's guarantees rest on; ``config`` cannot override them.
REQUIRED: Mapping[str, Any] = {
    "enable.idempotence": True,  # no duplicates or reordering from the producer's retries
    "acks": "all",
}

#: Defaults that ``config`` may override. ``linger.ms`` is 0, not librdkafka's 5 ms: a
#: ``publish`` waits for its report, so a lone record would wait the whole linger (5.7 ms
#: against 0.08 ms, one thread then publishes about 200 records a second). A dispatcher
#: that drains backlogs may set a few ms (docs: the Kafka how-to).
DEFAULTS: Mapping[str, Any] = {
    # The partitioner of the Java client and kafkajs: every client maps a key to the same
    # partition, so one aggregate's records share a partition whoever produces them.
    "partitioner": "murmur2_random",
    "linger.ms": 0,
    "message.timeout.ms": 30_000,
    # An unknown topic fails its records after this long instead of ``message.timeout.ms``.
    "topic.metadata.propagation.max.ms": 5_000,
}


class _Round:
    """The delivery reports of one ``publish_many`` round, counted: whoever waits is woken
    once, by the last report, instead of once per record.

    The producer's poll thread calls :meth:`report` (through ``functools.partial``, one
    per record); a record ``produce`` refused gets no report and is :meth:`settled` at
    once. ``wake`` runs exactly once, in the thread of the last report or settlement.
    """

    __slots__ = ("_left", "_lock", "_wake", "errors", "reported")

    def __init__(self, count: int, wake: Callable[[], object]) -> None:
        self.errors: list[KafkaError | None] = [None] * count
        self.reported = [False] * count
        self._left = count
        self._lock = threading.Lock()
        self._wake = wake

    def report(self, index: int, error: KafkaError | None, _: Message) -> None:
        self.errors[index] = error
        self.reported[index] = True
        self.settled()

    def settled(self) -> None:
        """One record fewer to wait for."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._wake()


#: A record as ``produce`` takes it: topic, value, key, headers, timestamp in ms.
_Record = tuple[str, bytes, bytes, Headers, int]


def _what(entry: OutboxMessage, topic: str) -> str:
    """What publishing ``entry`` is, for its errors (built only when one is raised)."""
    return f"publish entry {entry.id} to topic {topic!r}"


class _Sending:
    """One round on its way, shared by the sync and asyncio publishers: each entry's
    record built once, produced in order (:meth:`produce` stops at a full local queue and
    goes on from there when called again), then one outcome per entry.

    An entry's outcome is the error ``produce`` raised for it (the record was not sent;
    a local queue still full ``message.timeout.ms`` after the round began counts as
    ``BrokerUnavailable``), else its delivery report's error, else None once delivered.
    """

    __slots__ = (
        "_deadline",
        "_next",
        "_producer",
        "_publisher",
        "entries",
        "records",
        "refused",
        "reports",
    )

    def __init__(
        self,
        publisher: KafkaPublisher,
        producer: Producer,
        entries: Sequence[OutboxMessage],
        wake: Callable[[], object],
    ) -> None:
        self._publisher = publisher
        self._producer = producer
        self.entries = entries
        self.records = [publisher._record(entry) for entry in entries]
        self.refused: list[DocOutboxError | None] = [None] * len(entries)
        self.reports = _Round(len(entries), wake)
        self._next = 0
        self._deadline = time.monotonic() + publisher._timeout

    def produce(self) -> bool:
        """Produce the records not produced yet, in order; False if the local queue filled
        up first (call again once reports have made room)."""
        producer, reports = self._producer, self.reports
        for index in range(self._next, len(self.records)):
            topic, body, key, headers, timestamp = self.records[index]
            try:
                producer.produce(
                    topic,
                    body,
                    key,
                    headers=headers,
                    timestamp=timestamp,
                    on_delivery=partial(reports.report, index),
                )
            except BufferError as exc:
                if time.monotonic() < self._deadline:
                    self._next = index
                    return False
                self._refuse(index, translate(exc, _what(self.entries[index], topic)))
            except KafkaException as exc:
                self._refuse(index, translate(exc, _what(self.entries[index], topic)))
        self._next = len(self.records)
        return True

    def _refuse(self, index: int, error: DocOutboxError) -> None:
        """``produce`` refused the record: it was not sent, and no report will come."""
        self.refused[index] = error
        self.reports.settled()

    def outcomes(self) -> list[Exception | None]:
        """One outcome per entry, from what was refused and what was reported."""
        publisher, reports = self._publisher, self.reports
        outcomes: list[Exception | None] = []
        for index, refused in enumerate(self.refused):
            if refused is not None:
                outcomes.append(refused)
                continue
            if reports.reported[index] and reports.errors[index] is None:
                outcomes.append(None)
                continue
            what = _what(self.entries[index], self.records[index][0])
            if not reports.reported[index]:
                timeout = publisher._timeout
                outcomes.append(BrokerUnavailable(f"{what}: no delivery report within {timeout}s"))
                continue
            try:
                publisher._check(reports.errors[index], what)
            except DocOutboxError as exc:
                outcomes.append(exc)
        return outcomes


class KafkaPublisher:
    """A :class:`docoutbox.Publisher` for Kafka: returns only after the delivery report.

    Each entry becomes one record on the topic ``route(entry)`` if given, else the entry's
    ``destination``, else ``topic``, else the entry's ``type``. The record's key is the
    aggregate ID, so an aggregate's entries share a partition and keep their ``seq``
    order; its timestamp is the entry's ``created_at``. With ``wire`` plain (the default)
    its value is the encoded entry and its headers carry the entry's ID, type, ``seq``,
    aggregate, correlation and causation IDs and its own headers (for example a W3C
    ``traceparent``); CloudEvents structured and binary modes are
    :func:`~docoutbox_kafka.records.record_for`'s.

    The producer is idempotent with ``acks=all`` (always; ``config`` cannot turn that
    off). ``publish`` waits for the record's delivery report: success means the in-sync
    replicas have it. A failed report raises: ``PermanentPublishError`` for a record the
    cluster never accepts (too large), ``BrokerUnavailable`` for an unreachable cluster, a
    missing topic, refused access or a report that did not come within
    ``message.timeout.ms``, and ``PublishError`` otherwise.

    Latency: ``linger.ms`` is 0 unless ``config`` sets one, so a lone record leaves at
    once; a dispatcher draining backlogs spends less CPU per record with a few ms, at that
    much more latency per round.

    Threads: one instance is shared by any number of threads; each ``publish`` waits only
    for its own record, so a dispatcher's workers keep several records in flight at once
    and the producer batches them. ``publish_many`` produces a whole round before waiting
    for its reports (:class:`~docoutbox.ports.dispatch.PipelinedPublisher`). A background
    thread serves the delivery reports. Call :meth:`close` (or use ``with``) to flush and
    stop it.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        topic: str | None = None,
        *,
        route: Callable[[OutboxMessage], str] | None = None,
        wire: WireFormat = WireFormat.PLAIN,
    ) -> None:
        self.wire = WireFormat(wire)
        settings = client_settings(config)
        settings = {**DEFAULTS, **settings, **REQUIRED}
        settings.setdefault("client.id", "docoutbox-publisher")
        self.topic = topic
        self.route = route
        self._settings = settings
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._fatal: KafkaError | None = None
        self._poller: threading.Thread | None = None
        self._closing = threading.Event()
        self._timeout = float(settings["message.timeout.ms"]) / 1000

    def __repr__(self) -> str:
        servers = masked_config(self._settings).get("bootstrap.servers")
        return f"<KafkaPublisher {servers} topic={self.topic!r}>"

    def topic_for(self, entry: OutboxMessage) -> str:
        if self.route is not None:
            return self.route(entry)
        return entry.destination or self.topic or entry.type

    def trace_attributes(self, entry: OutboxMessage) -> dict[str, str]:
        """OpenTelemetry attributes of publishing ``entry``: the topic is the destination."""
        return {"messaging.system": "kafka", "messaging.destination.name": self.topic_for(entry)}

    def publish(self, entry: OutboxMessage) -> None:
        outcome = self.publish_many([entry])[0]
        if outcome is not None:
            raise outcome

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """Produce every entry's record, then wait for their delivery reports: one outcome
        per entry, None once delivered, else the error ``publish`` would raise for it (a
        record refused by ``produce`` itself, say too large, is never sent). The records
        are independent (see :class:`~docoutbox.ports.dispatch.PipelinedPublisher`)."""
        if not entries:
            return []
        try:
            producer = self._current()
        except DocOutboxError as exc:  # nothing was sent
            return [exc] * len(entries)
        done = threading.Event()
        sending = _Sending(self, producer, entries, done.set)
        while not sending.produce():
            time.sleep(0.01)  # the local queue is full: it empties as reports come in
        # Every report comes within message.timeout.ms; the margin covers a slow poll.
        done.wait(self._timeout + 30)
        return sending.outcomes()

    def _record(self, entry: OutboxMessage) -> _Record:
        """An entry's record, built once however often ``produce`` must be retried."""
        body, headers = record_for(entry, self.wire)
        key = str(entry.aggregate_id).encode()
        timestamp = int(entry.created_at.timestamp() * 1000)
        return self.topic_for(entry), body, key, headers, timestamp

    def _check(self, error: KafkaError | None, what: str) -> None:
        """Raise the docoutbox error for a failed delivery report (none if it succeeded)."""
        if error is None:
            return
        if error.fatal():
            with self._lock:
                self._fatal = error
        raise translate_error(error, what)

    def check(self, timeout: float = 10.0) -> None:
        """Fail fast on a cluster this publisher cannot use: reach it, and make sure the
        default ``topic`` (if any) exists.

        Raises :class:`~docoutbox.errors.BrokerUnavailable` when no broker answers within
        ``timeout`` seconds, and :class:`~docoutbox.errors.PermanentPublishError` when the
        topic does not exist.
        """
        producer = self._current()
        servers = masked_config(self._settings).get("bootstrap.servers")
        with translated(f"reach Kafka at {servers}"):
            metadata = producer.list_topics(timeout=timeout)
        if self.topic is not None:
            found = metadata.topics.get(self.topic)
            if found is None or found.error is not None:
                raise PermanentPublishError(
                    f"topic {self.topic!r} does not exist on {servers}; create it first"
                )

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for every record in flight; return how many are still undelivered."""
        producer = self._producer
        return 0 if producer is None else int(producer.flush(timeout))

    def close(self, timeout: float = 30.0) -> None:
        """Flush, stop the report thread and drop the producer. A later publish reopens."""
        self.flush(timeout)
        self._closing.set()
        poller = self._poller
        if poller is not None:
            poller.join(timeout=5)
        with self._lock:
            self._producer, self._poller = None, None
            self._closing = threading.Event()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _current(self) -> Producer:
        """The producer: created on first use, and replaced after a fatal error (the
        idempotent producer's state is lost then; a new one starts a new sequence)."""
        with self._lock:
            if self._fatal is not None and self._producer is not None:
                log.warning("replacing the Kafka producer after: %s", self._fatal.str())
                self._closing.set()  # its report thread serves what is left, then stops
                self._producer, self._poller = None, None
                self._closing = threading.Event()
            if self._producer is None:
                with translated("create the Kafka producer"):
                    self._producer = Producer(self._settings, logger=log, error_cb=self._on_error)
                self._fatal = None
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(
                    target=self._serve_reports,
                    args=(self._producer, self._closing),
                    name="docoutbox-kafka-reports",
                    daemon=True,
                )
                self._poller.start()
            return self._producer

    def _serve_reports(self, producer: Producer, closing: threading.Event) -> None:
        while not closing.is_set():
            producer.poll(0.1)
        producer.flush(self._timeout)  # every record still in flight gets its report

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            log.error("the Kafka producer failed fatally: %s", error.str())
            with self._lock:
                self._fatal = error
        else:
            log.info("Kafka producer: %s", error.str())


class AsyncKafkaPublisher:
    """The :class:`docoutbox.AsyncPublisher` twin of :class:`KafkaPublisher`: the same
    records, settings and errors; ``await publish(entry)`` returns after the record's
    delivery report without blocking the event loop (the report thread resolves the
    awaiting future). Concurrent publishes share one idempotent producer.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        topic: str | None = None,
        *,
        route: Callable[[OutboxMessage], str] | None = None,
        wire: WireFormat = WireFormat.PLAIN,
    ) -> None:
        self.sync = KafkaPublisher(config, topic, route=route, wire=wire)

    def __repr__(self) -> str:
        return f"<AsyncKafkaPublisher {self.sync!r}>"

    @property
    def topic(self) -> str | None:
        return self.sync.topic

    @topic.setter
    def topic(self, value: str | None) -> None:
        self.sync.topic = value

    @property
    def route(self) -> Callable[[OutboxMessage], str] | None:
        return self.sync.route

    @route.setter
    def route(self, value: Callable[[OutboxMessage], str] | None) -> None:
        self.sync.route = value

    def trace_attributes(self, entry: OutboxMessage) -> dict[str, str]:
        """See :meth:`KafkaPublisher.trace_attributes`."""
        return self.sync.trace_attributes(entry)

    async def publish(self, entry: OutboxMessage) -> None:
        outcome = (await self.publish_many([entry]))[0]
        if outcome is not None:
            raise outcome

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The async twin of :meth:`KafkaPublisher.publish_many`: every record produced,
        then their reports awaited without blocking the event loop. The report thread
        wakes the loop once per round, with the round's last report."""
        if not entries:
            return []
        sync = self.sync
        loop = asyncio.get_running_loop()
        try:
            producer = sync._current()
        except DocOutboxError as exc:  # nothing was sent
            return [exc] * len(entries)
        done: asyncio.Future[None] = loop.create_future()
        sending = _Sending(
            sync, producer, entries, partial(loop.call_soon_threadsafe, _resolve, done)
        )
        while not sending.produce():
            await asyncio.sleep(0.01)  # the local queue is full: reports empty it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, sync._timeout + 30)
        return sending.outcomes()

    async def close(self, timeout: float = 30.0) -> None:
        """Flush and stop the report thread (in a worker thread: flushing blocks)."""
        await asyncio.to_thread(self.sync.close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
