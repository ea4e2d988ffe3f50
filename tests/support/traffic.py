"""End-to-end traffic: producer threads committing commands, a receiver consuming a queue.

Producers are :class:`~docoutbox.testing.contract.Counter` aggregates: each ``Add``
command commits ``emits`` outgoing ``Added`` messages. The receiver runs a
:class:`~docoutbox_rabbitmq.RabbitConsumer` into :class:`~benchmarks.ledger.Ledger`
aggregates, one per producer, and records every delivery it settles.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.ledger import Ledger, by_source, ledger_handlers
from docoutbox import AggregateStore, InboxPolicy, Message, StoreConfig
from docoutbox.receive import Verdict
from docoutbox.testing.contract import Counter, counter_handlers
from docoutbox_kafka import KafkaConsumer
from docoutbox_rabbitmq import RabbitConsumer, RabbitPublisher

#: Receivers de-duplicate exactly, by (source, seq), whatever the number of redeliveries.
RECEIVER_CONFIG = StoreConfig(inbox=InboxPolicy(window=0, exact=True))


class Producers:
    """Threads that handle ``Add`` commands on producer aggregates until told to stop."""

    def __init__(
        self, store: AggregateStore[Counter], ids: list[str], rng: random.Random, emits: int = 3
    ) -> None:
        self.store = store
        self.ids = ids
        self.emits = emits
        self.commands = 0
        self.errors: list[BaseException] = []
        self._rng = random.Random(rng.random())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._numbers = {aggregate_id: 0 for aggregate_id in ids}

    def _next(self, aggregate_id: str) -> int:
        with self._lock:
            self._numbers[aggregate_id] += 1
            self.commands += 1
            return self._numbers[aggregate_id]

    def send(self, aggregate_id: str, number: int) -> None:
        message = Message(
            id=f"cmd-{aggregate_id}-{number}",
            type="Add",
            payload={"n": 1, "emits": self.emits},
        )
        outcome = self.store.handle(aggregate_id, message, counter_handlers, create=True)
        assert outcome.applied, outcome

    def run_commands(self, per_aggregate: int) -> None:
        """Commit ``per_aggregate`` commands on every producer, interleaved, on this thread."""
        for _ in range(per_aggregate):
            for aggregate_id in self.ids:
                self.send(aggregate_id, self._next(aggregate_id))

    def start(self, threads: int, pause: float) -> None:
        """Commit commands on random producers from ``threads`` threads until :meth:`stop`."""

        def work(seed: float) -> None:
            rng = random.Random(seed)
            try:
                while not self._stop.is_set():
                    aggregate_id = rng.choice(self.ids)
                    self.send(aggregate_id, self._next(aggregate_id))
                    self._stop.wait(rng.uniform(0, 2 * pause))
            except BaseException as exc:
                self.errors.append(exc)

        for _ in range(threads):
            thread = threading.Thread(target=work, args=(self._rng.random(),), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        assert not self.errors, self.errors

    def expected(self) -> dict[str, int]:
        """Per source, the last seq committed: the receiver must apply exactly 1..that."""
        out = {}
        for aggregate_id in self.ids:
            snapshot = self.store.load(aggregate_id)
            if snapshot is not None and snapshot.outbox_seq:
                out[f"Counter/{aggregate_id}"] = snapshot.outbox_seq
        return out

    def pending(self) -> dict[str, list[str]]:
        """Entry IDs still in each producer's outbox."""
        out = {}
        for aggregate_id in self.ids:
            snapshot = self.store.load(aggregate_id)
            if snapshot is not None and snapshot.raw_outbox:
                out[aggregate_id] = [str(e.get("id")) for e in snapshot.raw_outbox]
        return out


@dataclass(frozen=True)
class Delivery:
    id: str | None
    source: str | None
    seq: int | None
    redelivered: bool
    action: str
    duplicate: bool
    #: Where the broker stored it, if it says ((partition, offset) on Kafka): a message
    #: read again at the same position is a redelivery, at another one a re-publish.
    position: tuple[int, int] | None = None


@dataclass
class Receiver:
    """A consumer thread feeding ledgers; records every delivery in settle order."""

    url: str
    queue: str
    store: AggregateStore[Ledger]
    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def record(
        self, verdict: Verdict, redelivered: bool, position: tuple[int, int] | None = None
    ) -> None:
        message, outcome = verdict.message, verdict.outcome
        self.deliveries.append(
            Delivery(
                message.id if message else None,
                message.source if message else None,
                message.seq if message else None,
                redelivered,
                str(verdict.action),
                bool(outcome is not None and outcome.duplicate),
                position,
            )
        )

    def consumer(self, prefetch: int) -> Any:
        return RabbitConsumer(
            self.url,
            self.queue,
            self.store,
            ledger_handlers,
            aggregate_id_of=by_source,
            create=True,
            prefetch=prefetch,
            on_verdict=self.record,
        )

    def start(self, prefetch: int = 32) -> None:
        consumer = self.consumer(prefetch)

        def work() -> None:
            try:
                consumer.run(stop=self._stop, poll=0.05)
            except BaseException as exc:
                self.errors.append(exc)
            finally:
                consumer.close()

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        assert not self.errors, self.errors

    def applied(self, sources: list[str]) -> dict[str, list[int]]:
        """Per source, the seqs its ledger applied, in the order it applied them."""
        out = {}
        for source in sources:
            snapshot = self.store.load(source)
            out[source] = snapshot.state.seqs.get(source, []) if snapshot is not None else []
        return out

    def wait_for(
        self, expected: dict[str, int], timeout: float, also: Callable[[], bool] = lambda: True
    ) -> dict[str, list[int]]:
        """Poll until every ledger holds as many seqs as expected (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            assert not self.errors, self.errors
            applied = self.applied(sorted(expected))
            done = all(len(applied[s]) >= n for s, n in expected.items())
            if (done and also()) or time.monotonic() > deadline:
                return applied
            time.sleep(0.2)


@dataclass
class KafkaReceiver(Receiver):
    """A :class:`Receiver` reading a Kafka topic (``url`` is the bootstrap servers,
    ``queue`` the topic) with a :class:`~docoutbox_kafka.KafkaConsumer`."""

    group: str = "dx-receiver"
    dead_letters: str = "dx-dead"

    def consumer(self, prefetch: int) -> Any:
        def record(verdict: Verdict, kafka_record: Any) -> None:
            position = (int(kafka_record.partition()), int(kafka_record.offset()))
            self.record(verdict, False, position)

        return KafkaConsumer(
            self.url,
            self.queue,
            self.group,
            self.store,
            ledger_handlers,
            aggregate_id_of=by_source,
            dead_letter_topic=self.dead_letters,
            create=True,
            on_verdict=record,
        )


def republished(deliveries: list[Delivery]) -> dict[str, int]:
    """Per message ID, how many times it was published again: first deliveries beyond one.

    Broker redeliveries (the consumer's own requeues, or a Kafka record read again at the
    same offset) are not re-publishes.
    """
    counts: dict[str, int] = {}
    positions: dict[str, set[tuple[int, int]]] = {}
    for delivery in deliveries:
        if delivery.id is None:
            continue
        if delivery.position is not None:
            positions.setdefault(delivery.id, set()).add(delivery.position)
        elif not delivery.redelivered:
            counts[delivery.id] = counts.get(delivery.id, 0) + 1
    for key, seen in positions.items():
        counts[key] = counts.get(key, 0) + len(seen)
    return {key: n - 1 for key, n in counts.items() if n > 1}


def ledger_problems(
    applied: dict[str, list[int]], expected: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """Per source whose ledger is not exactly 1..N in order: what is missing, repeated,
    unexpected or out of order. Empty when every message was processed exactly once."""
    problems: dict[str, dict[str, Any]] = {}
    for source in sorted(set(applied) | set(expected)):
        seqs, want = applied.get(source, []), range(1, expected.get(source, 0) + 1)
        if seqs == list(want):
            continue
        seen = set(seqs)
        problems[source] = {
            "missing": [n for n in want if n not in seen],
            "repeated": sorted({n for n in seqs if seqs.count(n) > 1}),
            "unexpected": sorted(seen - set(want)),
            "in_order": seqs == sorted(seqs),
        }
    return problems


def summary(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in values.items())


def rabbit_traffic(
    url: str,
    exchange: str,
    queue: str,
    producers: Any,
    ledgers: Any,
    rng: random.Random,
    *,
    count: int,
    emits: int,
) -> tuple[Producers, Receiver]:
    """``count`` producers on the store backend ``producers``, publishing through
    ``exchange`` into ``queue`` (declared here, bound to every key), and a receiver of
    that queue into ledgers on the store backend ``ledgers``."""
    with RabbitPublisher(url, exchange) as setup:
        setup.declare(queues={queue: ["#"]})
    sender = Producers(
        AggregateStore(producers, Counter),
        [f"p{i:02d}" for i in range(count)],
        rng,
        emits=emits,
    )
    return sender, Receiver(url, queue, AggregateStore(ledgers, Ledger, RECEIVER_CONFIG))


def unexplained_republishes(
    again: dict[str, int], pending_at_kill: list[set[str]]
) -> dict[str, tuple[int, int]]:
    """The message IDs published again more often than kills left them pending
    (untrimmed): (re-publishes, kills that found the ID pending). Empty when a kill
    explains every re-publish."""
    kills_pending = {i: sum(i in pending for pending in pending_at_kill) for i in again}
    return {i: (n, kills_pending[i]) for i, n in again.items() if n > kills_pending[i]}
