"""RabbitConsumer against a real broker: ack after commit, de-duplication, requeue, reject."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from benchmarks.rabbit import Sandbox
from docoutbox import AggregateStore, AsyncAggregateStore, InboxPolicy, Message, StoreConfig
from docoutbox.codec import WireFormat, decode_entry, encode_entry
from docoutbox.errors import BrokerUnavailable, PermanentStoreError, TransientStoreError
from docoutbox.model import OutboxMessage
from docoutbox.receive import HandlerRetry
from docoutbox.retry import RetryPolicy
from docoutbox.testing import AsyncMemoryBackend, MemoryDeadLetters
from docoutbox_rabbitmq import RabbitConsumer, RabbitPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitConsumer
from tests.integration.conftest import RABBITMQ_CLIENTS
from tests.support.aio import Blocking
from tests.support.e2e import FaultyBackend, broker_address, require_rabbitmq, through
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq

EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))


@pytest.fixture(scope="module")
def url() -> str:
    return require_rabbitmq()


@pytest.fixture
def queue(url: str, box: Sandbox) -> str:
    """A fresh durable queue on the default exchange, dead-lettering to ``<queue>-dead``."""
    _, name, dead = box.names(exchange=False)
    with RabbitPublisher(url) as publisher:
        publisher.declare(queues={name: []}, dead_letters=dead)
    return name


def dead_letters_of(box: Sandbox) -> str:
    return box.queues[-1]


def publish(url: str, queue: str, entries: list[OutboxMessage]) -> None:
    with RabbitPublisher(url, routing_key=queue) as publisher:
        for entry in entries:
            publisher.publish(entry)


@pytest.fixture(params=RABBITMQ_CLIENTS)
def consumer(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """A factory of consumers of one client library (pika, or aio-pika on its own event
    loop over an async store sharing the backend), closed afterwards."""
    opened: list[Any] = []

    def make(
        url: str,
        queue: str,
        backend: FaultyBackend,
        config: StoreConfig = EXACT,
        **options: object,
    ) -> Any:
        common: dict[str, Any] = {
            "aggregate_id_of": by_source,
            "create": True,
            "requeue_delay": 0.01,
            **options,
        }
        if request.param == "pika":
            store = AggregateStore(backend, Ledger, config)
            created: Any = RabbitConsumer(url, queue, store, ledger_handlers, **common)
        else:
            astore = AsyncAggregateStore(AsyncMemoryBackend(backend), Ledger, config)
            created = Blocking(AsyncRabbitConsumer(url, queue, astore, ledger_handlers, **common))
        opened.append(created)
        return created

    yield make
    while opened:
        opened.pop().close()


def ledger(backend: FaultyBackend, producer: str) -> Ledger:
    snapshot = AggregateStore(backend, Ledger).get(f"Producer/{producer}")
    return snapshot.state


def test_applies_each_delivery_once_in_order(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    entries = [make_entry(p, seq) for seq in range(1, 11) for p in ("a", "b", "c")]
    publish(url, queue, entries)
    backend = FaultyBackend()
    worker = consumer(url, queue, backend)
    stats = worker.run(max_messages=30, idle_timeout=5)
    worker.close()
    assert (stats.delivered, stats.applied, stats.duplicates) == (30, 30, 0)
    for producer in "abc":
        assert ledger(backend, producer).seqs == {f"Producer/{producer}": list(range(1, 11))}
    assert box.depth(queue) == 0


@pytest.mark.parametrize("config", [EXACT, StoreConfig()], ids=["watermarks", "id-window"])
def test_redelivered_duplicates_are_acked_without_reapplying(
    url: str, box: Sandbox, queue: str, config: StoreConfig, consumer: Any
) -> None:
    entries = [make_entry("a", seq) for seq in range(1, 6)]
    publish(url, queue, entries + entries[::-1])
    backend = FaultyBackend()
    stats = consumer(url, queue, backend, config).run(max_messages=10, idle_timeout=5)
    assert (stats.applied, stats.duplicates, stats.rejected) == (5, 5, 0)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3, 4, 5]
    assert ledger(backend, "a").total == 5
    assert box.depth(queue) == 0


def test_crash_between_commit_and_ack_redelivers_a_duplicate(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    publish(url, queue, [make_entry("a", 1)])
    backend = FaultyBackend()
    with TcpProxy(broker_address(url)) as proxy:

        def crash() -> None:  # the connection dies between commit and ack
            time.sleep(0.3)  # an ack sent before the commit would have reached the broker
            proxy.cut()

        backend.after_write = crash
        first = consumer(through(url, proxy.port), queue, backend)
        with pytest.raises(BrokerUnavailable):
            first.run(idle_timeout=2)
    backend.after_write = None
    second = consumer(url, queue, backend)
    stats = second.run(max_messages=1, idle_timeout=5)  # nothing comes if it was acked early
    assert (stats.applied, stats.duplicates, stats.redelivered) == (0, 1, 1)
    assert ledger(backend, "a").seqs["Producer/a"] == [1]
    assert box.depth(queue) == 0


def test_malformed_and_invalid_deliveries_are_rejected_to_dead_letters(
    url: str, box: Sandbox, queue: str, caplog: pytest.LogCaptureFixture, consumer: Any
) -> None:
    bad_bodies = [b"not json at all", b'{"id": "x", "type": "Event"}']
    box.channel.confirm_delivery()
    for body in bad_bodies:
        box.channel.basic_publish("", queue, body)
    unknown = make_entry("a", 1, type="NoSuchType")
    good = make_entry("a", 2)
    exploding = make_entry("b", 1)
    publish(url, queue, [unknown, good, exploding])

    def handler(state: Ledger, message: Message) -> Ledger:
        if message.source == "Producer/b":
            raise RuntimeError("business rule broken")
        return ledger_handlers(state, message)  # type: ignore[return-value]

    backend = FaultyBackend()
    worker = consumer(url, queue, backend)
    worker.handler = handler
    with caplog.at_level(logging.WARNING, logger="docoutbox.rabbitmq"):
        stats = worker.run(max_messages=5, idle_timeout=5)
    assert (stats.applied, stats.rejected, stats.requeued) == (1, 4, 0)
    assert box.depth(queue) == 0
    dead = [body for _, body in box.drain(dead_letters_of(box))]
    assert dead[:2] == bad_bodies
    assert [decode_entry(b).id for b in dead[2:]] == [unknown.id, exploding.id]
    rejections = [r for r in caplog.records if r.message.startswith("rejecting")]
    assert len(rejections) == 4
    assert "UnknownMessageType" in caplog.text and "business rule broken" in caplog.text
    # The non-JSON body and the unknown type are expected: one warning line each, no
    # traceback; the handler's RuntimeError and by_source's failure on a message without
    # a source are bugs: errors with their tracebacks.
    expected = [r for r in rejections if r.levelno == logging.WARNING]
    assert len(expected) == 2 and all(r.exc_info is None for r in expected)
    assert all("\n" not in r.getMessage() for r in expected)
    assert f"message {unknown.id} (type NoSuchType)" in caplog.text
    assert all(r.exc_info is not None for r in rejections if r.levelno == logging.ERROR)


def test_gave_up_is_requeued_then_applied(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    publish(url, queue, [make_entry("a", 1), make_entry("a", 2)])
    backend = FaultyBackend()
    backend.refuse_writes = 1  # one conflict; with a single attempt the store gives up
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True), retry=RetryPolicy(1))
    stats = consumer(url, queue, backend, config, prefetch=1).run(max_messages=3, idle_timeout=5)
    assert (stats.requeued, stats.applied, stats.redelivered) == (1, 2, 1)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2]  # prefetch 1 keeps the order
    assert box.depth(queue) == 0


def test_transient_store_error_is_requeued(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    publish(url, queue, [make_entry("a", 1)])
    backend = FaultyBackend()
    backend.load_errors = [TransientStoreError("flaky")] * 4  # twice what the store retries
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True), retry=RetryPolicy(2))
    stats = consumer(url, queue, backend, config).run(max_messages=3, idle_timeout=5)
    assert (stats.requeued, stats.applied) == (2, 1)
    assert ledger(backend, "a").seqs["Producer/a"] == [1]


def test_permanent_store_error_requeues_and_stops(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    entry = make_entry("a", 1)
    publish(url, queue, [entry])
    backend = FaultyBackend()
    backend.load_errors = [PermanentStoreError("auth failed")]
    worker = consumer(url, queue, backend)
    with pytest.raises(PermanentStoreError):
        worker.run(idle_timeout=2)
    worker.close()
    assert box.depth(queue) == 1
    assert consumer(url, queue, backend).run(max_messages=1, idle_timeout=5).applied == 1


def test_idle_timeout_and_stop_event(url: str, queue: str, consumer: Any) -> None:
    worker = consumer(url, queue, FaultyBackend())
    started = time.monotonic()
    assert worker.run(idle_timeout=0.3, poll=0.05).delivered == 0
    assert time.monotonic() - started < 3
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    worker.run(stop=stop, poll=0.05)
    assert time.monotonic() - started < 3
    worker.close()


def test_body_is_the_encoded_entry(url: str, box: Sandbox, queue: str) -> None:
    entry = make_entry("a", 3, headers={"traceparent": "t"})
    publish(url, queue, [entry])
    item = box.get(queue)
    assert item is not None and item[1] == encode_entry(entry)


@pytest.mark.parametrize("wire", list(WireFormat))
def test_every_wire_format_is_applied_once(
    url: str, box: Sandbox, queue: str, consumer: Any, wire: WireFormat
) -> None:
    entries = [make_entry("a", seq, headers={"traceparent": f"t{seq}"}) for seq in (1, 2, 3)]
    with RabbitPublisher(url, routing_key=queue, wire=wire) as publisher:
        for entry in entries + entries:
            publisher.publish(entry)
    backend = FaultyBackend()
    stats = consumer(url, queue, backend).run(max_messages=6, idle_timeout=5)
    assert (stats.applied, stats.duplicates, stats.rejected) == (3, 3, 0)
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3]
    assert box.depth(queue) == 0


class Letters:
    """A dead-letter store over MemoryDeadLetters whose next ``broken`` puts fail; its
    ``put`` is async for the aio-pika consumer (``AsyncMongoDeadLetters``' shape)."""

    def __init__(self, asynchronous: bool) -> None:
        self.memory = MemoryDeadLetters()
        self.broken = 0
        self.put: Any = self._put_async if asynchronous else self._put

    def _put(self, *args: Any, **kwargs: Any) -> None:
        if self.broken:
            self.broken -= 1
            raise TransientStoreError("dead letters unavailable")
        self.memory.put(*args, **kwargs)

    async def _put_async(self, *args: Any, **kwargs: Any) -> None:
        self._put(*args, **kwargs)


FAST_RETRY = HandlerRetry(immediate=1, delayed=2, base_delay=0.01, max_delay=0.02)


def poisoned(calls: list[str]) -> Callable[[Ledger, Message], Ledger]:
    def handler(state: Ledger, message: Message) -> Ledger:
        if message.source == "Producer/b":
            calls.append(message.id)
            raise RuntimeError("poison")
        return ledger_handlers(state, message)  # type: ignore[return-value]

    return handler


def test_a_poison_message_is_retried_then_kept_in_the_dead_letter_store(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    entries = [make_entry("a", seq) for seq in (1, 2, 3)]
    poison = make_entry("b", 1)
    publish(url, queue, [*entries, poison, *entries])  # the second copies are redeliveries
    backend = FaultyBackend()
    calls: list[str] = []
    worker = consumer(url, queue, backend, retry=FAST_RETRY)
    letters = Letters(isinstance(worker, Blocking))
    worker.dead_letters = letters
    worker.handler = poisoned(calls)
    stats = worker.run(max_messages=7, idle_timeout=5)
    assert (stats.applied, stats.duplicates) == (3, 3)
    assert (stats.rejected, stats.dead_lettered, stats.retried) == (1, 1, 3)
    assert calls == [poison.id] * 4
    kept = letters.memory.entries[poison.id]
    assert (kept["origin"], kept["queue"], kept["attempts"]) == ("consume", queue, 4)
    assert "poison" in kept["error"] and decode_entry(kept["body"].encode()).id == poison.id
    assert ledger(backend, "a").seqs["Producer/a"] == [1, 2, 3]
    assert box.depth(queue) == 0


def test_a_reject_the_dead_letter_store_did_not_take_is_requeued(
    url: str, box: Sandbox, queue: str, consumer: Any
) -> None:
    poison = make_entry("b", 1)
    publish(url, queue, [poison])
    calls: list[str] = []
    worker = consumer(url, queue, FaultyBackend(), retry=FAST_RETRY)
    letters = Letters(isinstance(worker, Blocking))
    letters.broken = 1
    worker.dead_letters = letters
    worker.handler = poisoned(calls)
    stats = worker.run(max_messages=2, idle_timeout=5)
    assert (stats.requeued, stats.rejected, stats.dead_lettered, stats.redelivered) == (1, 1, 1, 1)
    assert calls == [poison.id] * 8  # retried in full on each delivery
    assert letters.memory.entries[poison.id]["attempts"] == 4
    assert box.depth(queue) == 0
