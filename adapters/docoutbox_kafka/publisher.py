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

from confluent_kafka import KafkaError, Message, Producer

from docoutbox.codec import WireFormat
from docoutbox.errors import BrokerUnavailable, DocOutboxError, PermanentPublishError
from docoutbox.model import OutboxMessage
from docoutbox_kafka.errors import translate_error, translated
from docoutbox_kafka.records import client_settings, masked_config, record_for

log = logging.getLogger("docoutbox.kafka")

#: Settings the publisher's guarantees rest on; ``config`` cannot override them.
REQUIRED: Mapping[str, Any] = {
    "enable.idempotence": True,  # no duplicates or reordering from the producer's retries
    "acks": "all",
}

#: Defaults that ``config`` may override.
DEFAULTS: Mapping[str, Any] = {
    # The partitioner of the Java client and kafkajs: every client maps a key to the same
    # partition, so one aggregate's records share a partition whoever produces them.
    "partitioner": "murmur2_random",
    # A publish waits for its report, so lingering only adds latency; records of concurrent
    # publishes still share batches while earlier requests are in flight.
    "linger.ms": 0,
    "message.timeout.ms": 30_000,
    # An unknown topic fails its records after this long instead of ``message.timeout.ms``.
    "topic.metadata.propagation.max.ms": 5_000,
}


class _Report:
    """The delivery report of one record, set from the producer's poll thread."""

    __slots__ = ("done", "error", "message")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: KafkaError | None = None
        self.message: Message | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        self.error, self.message = error, message
        self.done.set()


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
        topic = self.topic_for(entry)
        what = f"publish entry {entry.id} to topic {topic!r}"
        report = _Report()
        producer = self._current()
        deadline = time.monotonic() + self._timeout
        while not self._produce(producer, topic, entry, report, what, deadline):
            time.sleep(0.01)  # the local queue is full: it empties as reports come in
        # The report comes within message.timeout.ms; the margin covers a slow poll.
        if not report.done.wait(self._timeout + 30):
            raise BrokerUnavailable(f"{what}: no delivery report within {self._timeout}s")
        self._check(report.error, what)

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
        reports = _Round(len(entries), done.set)
        sent = self._produce_round(producer, entries, reports)
        # Every report comes within message.timeout.ms; the margin covers a slow poll.
        done.wait(self._timeout + 30)
        return self._outcomes(sent, reports)

    def _produce_round(
        self, producer: Producer, entries: Sequence[OutboxMessage], reports: _Round
    ) -> list[str | Exception]:
        """Produce every entry's record, each reporting to ``reports``: per entry, what its
        publish is (for errors), or the error ``produce`` raised (the record is not sent)."""
        deadline = time.monotonic() + self._timeout
        sent: list[str | Exception] = []
        for index, entry in enumerate(entries):
            topic = self.topic_for(entry)
            what = f"publish entry {entry.id} to topic {topic!r}"
            on_delivery = partial(reports.report, index)
            try:
                while not self._produce(producer, topic, entry, on_delivery, what, deadline):
                    time.sleep(0.01)  # the local queue is full: it empties as reports come in
            except DocOutboxError as exc:
                sent.append(exc)
                reports.settled()
            else:
                sent.append(what)
        return sent

    def _outcomes(self, sent: list[str | Exception], reports: _Round) -> list[Exception | None]:
        """One outcome per entry of a round, from what was sent and what was reported."""
        outcomes: list[Exception | None] = []
        for index, item in enumerate(sent):
            if isinstance(item, Exception):
                outcomes.append(item)
            elif not reports.reported[index]:
                outcomes.append(
                    BrokerUnavailable(f"{item}: no delivery report within {self._timeout}s")
                )
            else:
                try:
                    self._check(reports.errors[index], item)
                except DocOutboxError as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
        return outcomes

    def _produce(
        self,
        producer: Producer,
        topic: str,
        entry: OutboxMessage,
        on_delivery: Callable[[KafkaError | None, Message], None],
        what: str,
        deadline: float,
    ) -> bool:
        """Queue the entry's record; False if the local queue is full (try again)."""
        body, headers = record_for(entry, self.wire)
        try:
            with translated(what):
                producer.produce(
                    topic,
                    body,
                    str(entry.aggregate_id).encode(),
                    headers=headers,
                    timestamp=int(entry.created_at.timestamp() * 1000),
                    on_delivery=on_delivery,
                )
        except BrokerUnavailable as exc:
            if isinstance(exc.__cause__, BufferError) and time.monotonic() < deadline:
                return False
            raise
        return True

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
        sync = self.sync
        topic = sync.topic_for(entry)
        what = f"publish entry {entry.id} to topic {topic!r}"
        loop = asyncio.get_running_loop()
        reported: asyncio.Future[KafkaError | None] = loop.create_future()

        def on_delivery(error: KafkaError | None, _: Message) -> None:
            loop.call_soon_threadsafe(_resolve, reported, error)

        producer = sync._current()
        deadline = time.monotonic() + sync._timeout
        while not sync._produce(producer, topic, entry, on_delivery, what, deadline):
            await asyncio.sleep(0.01)  # the local queue is full: it empties as reports come in
        try:
            error = await asyncio.wait_for(reported, sync._timeout + 30)
        except TimeoutError:
            raise BrokerUnavailable(f"{what}: no delivery report within {sync._timeout}s") from None
        sync._check(error, what)

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """The async twin of :meth:`KafkaPublisher.publish_many`: every record produced,
        then their reports awaited without blocking the event loop."""
        if not entries:
            return []
        sync = self.sync
        loop = asyncio.get_running_loop()
        try:
            producer = sync._current()
        except DocOutboxError as exc:  # nothing was sent
            return [exc] * len(entries)
        done: asyncio.Future[KafkaError | None] = loop.create_future()
        reports = _Round(len(entries), partial(loop.call_soon_threadsafe, _resolve, done, None))
        deadline = time.monotonic() + sync._timeout
        sent: list[str | Exception] = []
        for index, entry in enumerate(entries):
            topic = sync.topic_for(entry)
            what = f"publish entry {entry.id} to topic {topic!r}"
            on_delivery = partial(reports.report, index)
            try:
                while not sync._produce(producer, topic, entry, on_delivery, what, deadline):
                    await asyncio.sleep(0.01)  # the local queue is full: reports empty it
            except DocOutboxError as exc:
                sent.append(exc)
                reports.settled()
            else:
                sent.append(what)
        # One wait for the whole round: the last report resolves ``done``.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, sync._timeout + 30)
        return sync._outcomes(sent, reports)

    async def close(self, timeout: float = 30.0) -> None:
        """Flush and stop the report thread (in a worker thread: flushing blocks)."""
        await asyncio.to_thread(self.sync.close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _resolve(future: asyncio.Future[KafkaError | None], error: KafkaError | None) -> None:
    if not future.done():
        future.set_result(error)
