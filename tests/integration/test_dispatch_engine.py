"""The dispatch engine on the in-memory backend, change source and publisher, driven by the
threaded :class:`Dispatcher` and by the :class:`AsyncDispatcher` alike."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, OutboxMessage
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.operations import AsyncGroupWriter, GroupWriter
from docoutbox.dispatch.drivers.ownership import LeaseKeeper, SoleOwner
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.engine.metrics import CountingMetrics, NullMetrics
from docoutbox.errors import (
    BrokerUnavailable,
    ChangeStreamLost,
    PermanentPublishError,
    PublishError,
)
from docoutbox.ports.dispatch import Position
from docoutbox.retry import Backoff
from docoutbox.store.document import utcnow
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints, MemoryLeaseTable

FAST = DispatcherConfig(
    name="t",
    concurrency=4,
    sweep_interval=3600,
    poll_interval=0.005,
    checkpoint_interval=0,
    policy=DispatchPolicy(max_attempts=3, base_delay=0.001, max_delay=0.005),
    backoff=Backoff(base=0.005, cap=0.05),
)


#: Which driver runs the engine in this test: "threaded" or "async".
DRIVER = ["threaded"]


@pytest.fixture(autouse=True, params=["threaded", "async"])
def driver(request: pytest.FixtureRequest) -> Iterator[str]:
    DRIVER[0] = request.param
    yield request.param
    DRIVER[0] = "threaded"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class Harness:
    def __init__(self, publisher: Any = None, config: DispatcherConfig = FAST) -> None:
        self.backend = MemoryBackend()
        self.store = AggregateStore(self.backend, Counter)
        self.source = MemoryChangeSource(self.backend)
        self.checkpoints = MemoryCheckpoints()
        self.publisher = publisher or MemoryPublisher()
        self.dead = MemoryDeadLetters()
        self.metrics = CountingMetrics()
        self.config = config
        self.dispatcher: Dispatcher | AsyncDispatcher | None = None
        self.thread: threading.Thread | None = None

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        outcome = self.store.handle(
            aggregate, add_msg(message_id, emits=emits), counter_handlers, create=True
        )
        assert outcome.applied

    def start(self, ownership: Any = None) -> Dispatcher | AsyncDispatcher:
        if DRIVER[0] == "async":
            return self._start_async(ownership)
        self.dispatcher = Dispatcher(
            self.backend,
            self.publisher,
            self.dead,
            source=self.source,
            checkpoints=self.checkpoints,
            ownership=ownership or SoleOwner(),
            config=self.config,
            metrics=self.metrics,
        )
        self.thread = threading.Thread(target=self.dispatcher.run, daemon=True)
        self.thread.start()
        assert self.dispatcher.started.wait(5)
        return self.dispatcher

    def _start_async(self, ownership: Any) -> AsyncDispatcher:
        """The same ports, as async ones (each call in a worker thread)."""
        dispatcher = AsyncDispatcher(
            in_thread(self.backend),
            in_thread(self.publisher),
            in_thread(self.dead),
            source=in_thread(self.source),
            checkpoints=in_thread(self.checkpoints),
            ownership=ownership or SoleOwner(),
            config=self.config,
            metrics=self.metrics,
        )
        self.dispatcher = dispatcher
        self.thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
        self.thread.start()
        assert self.dispatcher.started.wait(5)
        return self.dispatcher

    def stop(self) -> None:
        assert self.dispatcher is not None and self.thread is not None
        self.dispatcher.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()

    def pending(self) -> int:
        return sum(len(doc.get("outbox") or []) for doc in self.backend.docs.values())

    def emitted(self) -> dict[str, list[int]]:
        seqs: dict[str, list[int]] = {}
        for doc in self.backend.docs.values():
            seqs[doc["_id"]] = list(range(1, doc["outbox_seq"] + 1))
        return seqs


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    if h.thread is not None and h.thread.is_alive():
        h.stop()


def published_seqs(entries: list[OutboxMessage]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        assert isinstance(entry.aggregate_id, str)
        seqs[entry.aggregate_id].append(entry.seq)
    return dict(seqs)


def test_stream_events_are_published_in_seq_order_trimmed_and_checkpointed(
    harness: Harness,
) -> None:
    harness.start()
    for i in range(30):
        harness.write(f"a{i % 5}", f"m{i}", emits=2)
    wait_until(lambda: harness.pending() == 0 and len(harness.publisher.published) == 60)
    # The checkpoint reaches the end of the log (the dispatcher's own trims included).
    wait_until(lambda: harness.checkpoints.load("t") == len(harness.backend.changes))
    harness.stop()
    assert published_seqs(harness.publisher.published) == harness.emitted()
    assert harness.metrics.totals().published == 60


class LagRecorder(NullMetrics):
    """Keeps only the lags: a subclass of the metrics that keep nothing."""

    def __init__(self) -> None:
        self.lags: list[float] = []

    def published(self, entry: OutboxMessage, lag: float) -> None:
        self.lags.append(lag)


def test_a_subclass_of_null_metrics_is_given_each_publish_and_its_lag(harness: Harness) -> None:
    # The engine skips the lag (a clock read per entry) for NullMetrics itself only.
    recorder = harness.metrics = LagRecorder()  # type: ignore[assignment]
    harness.start()
    for i in range(4):
        harness.write(f"a{i}", f"m{i}")
    wait_until(lambda: len(recorder.lags) == 4)
    harness.stop()
    assert all(0 <= lag < 10 for lag in recorder.lags)


class OrderCheckingCheckpoints(MemoryCheckpoints):
    """Fails the test if a saved position passes a change whose entries are not out yet."""

    def __init__(self, harness: Harness) -> None:
        super().__init__()
        self.harness = harness
        self.violations: list[str] = []

    def save(self, name: str, position: Position) -> None:
        published = set(self.harness.publisher.ids())
        quarantined = set(self.harness.dead.entries)
        for doc in self.harness.backend.changes[:position]:
            current = self.harness.backend.docs.get(doc["_id"]) or {}
            still = {e["id"] for e in current.get("outbox") or []}
            for entry in doc.get("outbox") or []:
                if entry["id"] in still or entry["id"] not in published | quarantined:
                    self.violations.append(f"{position}: {entry['id']}")
        super().save(name, position)


def test_checkpoint_never_passes_unpublished_entries_during_an_outage() -> None:
    down = threading.Event()
    down.set()

    def fail(entry: OutboxMessage) -> BaseException | None:
        return BrokerUnavailable("broker down") if down.is_set() else None

    h = Harness(MemoryPublisher(fail=fail))
    h.checkpoints = checks = OrderCheckingCheckpoints(h)
    h.start()
    for i in range(20):
        h.write(f"a{i % 4}", f"m{i}")
    time.sleep(0.3)
    assert h.publisher.published == []
    assert h.pending() == 20
    assert checks.load("t") in (None, 0)  # the fresh start position at most
    down.clear()
    wait_until(lambda: h.pending() == 0)
    wait_until(lambda: checks.load("t") == len(h.backend.changes))
    h.stop()
    assert checks.violations == []
    assert published_seqs(h.publisher.published) == h.emitted()


def test_a_poison_entry_is_quarantined_and_the_rest_flow(harness: Harness) -> None:
    poison: set[str] = set()

    def fail(entry: OutboxMessage) -> BaseException | None:
        return PermanentPublishError("refused") if entry.id in poison else None

    harness.publisher = MemoryPublisher(fail=fail)
    harness.write("a", "m0", emits=3)
    poison.add(harness.store.get("a").outbox[1].id)
    harness.start()
    harness.write("b", "m1")
    wait_until(lambda: harness.pending() == 0)
    harness.stop()
    assert [e.seq for e in harness.publisher.published if e.aggregate_id == "a"] == [1, 3]
    [(entry_id, record)] = harness.dead.entries.items()
    assert entry_id in poison and "refused" in record["error"]
    assert harness.metrics.totals().quarantined == 1


def test_retried_failures_keep_order_and_eventually_quarantine(harness: Harness) -> None:
    attempts: dict[str, int] = defaultdict(int)

    def fail(entry: OutboxMessage) -> BaseException | None:
        attempts[entry.id] += 1
        if entry.seq == 2 and attempts[entry.id] <= 2:
            return PublishError("nack")  # succeeds on the third attempt
        return None

    harness.publisher = MemoryPublisher(fail=fail)
    harness.start()
    harness.write("a", "m0", emits=4)
    wait_until(lambda: harness.pending() == 0)
    harness.stop()
    assert [e.seq for e in harness.publisher.published] == [1, 2, 3, 4]
    assert harness.dead.entries == {}
    assert harness.metrics.totals().failed == 2


def test_an_unusable_checkpoint_leads_to_a_full_sweep(harness: Harness) -> None:
    for i in range(12):
        harness.write(f"a{i % 3}", f"m{i}")
    harness.checkpoints.save("t", "garbage")
    harness.start()
    wait_until(lambda: harness.pending() == 0)
    harness.write("late", "m-late")  # the restarted stream sees this
    wait_until(lambda: harness.pending() == 0)
    wait_until(lambda: harness.checkpoints.load("t") == len(harness.backend.changes))
    harness.stop()
    assert published_seqs(harness.publisher.published) == harness.emitted()


class LosingSource(MemoryChangeSource):
    """Can pause (see nothing) and then lose its position, like ChangeStreamHistoryLost."""

    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend)
        self.paused = False
        self.lose = False

    def poll(self, max_events: int) -> list[Any]:
        if self.lose:
            self.lose = False
            raise ChangeStreamLost("history lost")
        return [] if self.paused else super().poll(max_events)


def test_stream_loss_while_running_is_recovered_by_the_sweep(harness: Harness) -> None:
    harness.source = source = LosingSource(harness.backend)
    harness.start()
    harness.write("a", "m0")
    wait_until(lambda: harness.pending() == 0)
    source.paused = True
    harness.write("b", "m1")
    harness.write("c", "m2")
    time.sleep(0.05)
    assert harness.pending() == 2
    source.lose, source.paused = True, False  # the new stream starts after b and c
    wait_until(lambda: harness.pending() == 0)
    harness.write("d", "m3")
    wait_until(lambda: harness.pending() == 0)
    harness.stop()
    assert sorted(e.aggregate_id for e in harness.publisher.published) == ["a", "b", "c", "d"]
    assert source.opened[-1] > 2  # restarted from a fresh marker, past b and c


class SerialCheckingPublisher:
    """Slow publishes that record how many run at once, overall and per aggregate. It
    confirms each publish before it returns (no ``publish_many``): its concurrency comes
    from the workers, over which the dispatcher spreads the aggregates."""

    def __init__(self) -> None:
        self.memory = MemoryPublisher()
        self.published = self.memory.published
        self.active: dict[Any, int] = defaultdict(int)
        self.overlaps: list[Any] = []
        self.peak = 0
        self._guard = threading.Lock()

    def publish(self, entry: OutboxMessage) -> None:
        with self._guard:
            self.active[entry.aggregate_id] += 1
            if self.active[entry.aggregate_id] > 1:
                self.overlaps.append(entry.aggregate_id)
            self.peak = max(self.peak, sum(self.active.values()))
        time.sleep(0.002)
        self.memory.publish(entry)
        with self._guard:
            self.active[entry.aggregate_id] -= 1


def test_aggregates_run_concurrently_but_each_one_serially() -> None:
    h = Harness(SerialCheckingPublisher())
    h.start()
    writers = [
        threading.Thread(target=lambda w=w: [h.write(f"a{i % 6}", f"w{w}-{i}") for i in range(25)])
        for w in range(3)
    ]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    wait_until(lambda: h.pending() == 0)
    h.stop()
    assert h.publisher.overlaps == []
    assert h.publisher.peak > 1
    seqs = published_seqs(h.publisher.published)
    assert seqs == h.emitted()  # every entry once, in seq order per aggregate


class Revoking(SoleOwner):
    """Owns everything until ``revoke()``; then nothing is valid any more."""

    def __init__(self) -> None:
        self.revoked = threading.Event()

    def valid(self, partition: int) -> bool:
        return not self.revoked.is_set()


def test_no_publish_or_trim_once_the_partition_is_no_longer_held(harness: Harness) -> None:
    ownership = Revoking()

    def fail(entry: OutboxMessage) -> BaseException | None:
        if entry.seq == 1:
            ownership.revoked.set()  # the lease lapses while publishing the first entry
        return None

    harness.publisher = MemoryPublisher(fail=fail)
    harness.write("a", "m0", emits=3)
    harness.start(ownership)
    wait_until(lambda: len(harness.publisher.published) >= 1)
    time.sleep(0.1)
    harness.stop()
    assert [e.seq for e in harness.publisher.published] == [1]
    assert harness.pending() == 3  # not trimmed: the next owner will dispatch them


def test_stop_abandons_backoff_sleeps_and_keeps_entries_pending(harness: Harness) -> None:
    harness.config = DispatcherConfig(
        name="t",
        poll_interval=0.005,
        policy=DispatchPolicy(max_attempts=50, base_delay=5, max_delay=5),
    )
    harness.publisher = MemoryPublisher(fail=lambda e: PublishError("nack"))
    harness.write("a", "m0")
    harness.start()
    wait_until(lambda: harness.metrics.totals().failed >= 1)
    began = time.monotonic()
    harness.stop()
    assert time.monotonic() - began < 2
    assert harness.pending() == 1 and harness.dead.entries == {}


def test_a_batch_that_breaks_outside_its_runs_is_retried_not_stranded(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = [True]
    sync_all, async_all = GroupWriter.write_all, AsyncGroupWriter.write_all

    def first_round_garbled(outcomes: list[Any]) -> list[Any]:
        if broken[0]:
            broken[0] = False
            return outcomes[:-1]  # an answer of the wrong length breaks the batch
        return outcomes

    def sync_write_all(self: GroupWriter, plans: Any) -> list[Any]:
        return first_round_garbled(sync_all(self, plans))

    async def async_write_all(self: AsyncGroupWriter, plans: Any) -> list[Any]:
        return first_round_garbled(await async_all(self, plans))

    monkeypatch.setattr(GroupWriter, "write_all", sync_write_all)
    monkeypatch.setattr(AsyncGroupWriter, "write_all", async_write_all)
    harness.write("a", "m1")
    dispatcher = harness.start()
    wait_until(lambda: not broken[0] and harness.pending() == 0)
    # The batch's aggregate is retried (its trim was written: nothing left to publish),
    # not left running forever.
    wait_until(dispatcher.engine.queue.idle)
    assert {e.seq for e in harness.publisher.published} == {1}


def test_an_idle_loop_sweeps_a_partition_its_leases_gain_at_once(harness: Harness) -> None:
    """An idle loop sleeps until its next timed work (here a stream read a minute away, a
    due query and a sweep an hour away); a partition its lease keeper gains wakes it, and
    is swept then."""
    harness.config = DispatcherConfig(
        name="t",
        partitions=1,
        sweep_interval=3600,
        due_interval=3600,
        poll_interval=60.0,
        checkpoint_interval=0,
    )
    harness.write("a", "m0")  # before the stream opens: only a sweep of partition 0 finds it
    table = MemoryLeaseTable()
    table.leases[0] = ("other", utcnow() + timedelta(seconds=0.5))  # another's, for now
    keeper = LeaseKeeper(table, partitions=1, owner="me", timing=LeaseTiming(ttl=1.0))
    harness.start(keeper)
    wait_until(lambda: harness.pending() == 0)
    assert [e.seq for e in harness.publisher.published] == [1]
    harness.stop()
