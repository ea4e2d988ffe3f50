"""The dispatch engine stepped on a simulated clock: no thread, no event loop, no sleep.

The same properties as the driven tests of ``tests/integration/test_dispatch_engine.py``
(threaded and asyncio dispatchers on the wall clock), shown deterministically: each step
advances the clock by :data:`STEP`, takes one control turn and runs every run that may
start. A backoff :class:`~docoutbox.store.core.Sleep` only moves the clock. Bounds are
counted in steps.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, OutboxMessage
from docoutbox.dispatch.drivers.operations import Ports
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig
from docoutbox.dispatch.engine.metrics import CountingMetrics
from docoutbox.drive import Abandoned, drive
from docoutbox.errors import BrokerUnavailable, PermanentPublishError, PublishError
from docoutbox.ports.dispatch import Position
from docoutbox.retry import Backoff
from docoutbox.store.core import Sleep
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints

STEP = 0.005
#: Steps any property below must hold within: ten simulated seconds.
BOUND = 2000

CONFIG = DispatcherConfig(
    name="t",
    concurrency=4,
    sweep_interval=3600,
    poll_interval=STEP,
    checkpoint_interval=0,
    policy=DispatchPolicy(max_attempts=3, base_delay=0.001, max_delay=0.005),
    backoff=Backoff(base=0.005, cap=0.05),
)


class Stepped:
    """A memory backend, change log, publisher and checkpoints, and the engine over them."""

    def __init__(
        self,
        publisher: MemoryPublisher | None = None,
        seed: int = 0,
        config: DispatcherConfig = CONFIG,
    ) -> None:
        self.config = config
        self.backend = MemoryBackend()
        self.store = AggregateStore(self.backend, Counter)
        self.publisher = publisher or MemoryPublisher()
        self.dead = MemoryDeadLetters()
        self.checkpoints: MemoryCheckpoints = MemoryCheckpoints()
        self.metrics = CountingMetrics()
        self.now = 0.0
        self.slept = 0.0
        self.seed = seed
        self.engine: DispatchEngine | None = None

    def write(self, aggregate: str, message_id: str, emits: int = 1) -> None:
        outcome = self.store.handle(
            aggregate, add_msg(message_id, emits=emits), counter_handlers, create=True
        )
        assert outcome.applied

    def start(self) -> DispatchEngine:
        self.ports = Ports(
            self.backend,
            self.publisher,
            self.dead,
            MemoryChangeSource(self.backend),
            self.checkpoints,
        )
        self.engine = DispatchEngine(
            self.config,
            SoleOwner(),
            stream=True,
            checkpoints=True,
            monotonic=lambda: self.now,
            clock=lambda: datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=self.now),
            rng=random.Random(self.seed),
            metrics=self.metrics,
        )
        self.engine.begin()
        return self.engine

    def _perform(self, op: Any) -> Any:
        if isinstance(op, Sleep):
            self.now += op.seconds
            self.slept += op.seconds
            return None
        return self.ports.perform(op)

    def step(self) -> None:
        assert self.engine is not None
        self.now += STEP
        drive(self.engine.turn(), self._perform)
        if self.engine.trims_due():
            drive(self.engine.flush_trims(), self._perform)
        for slot in self.engine.start_runs():
            self.engine.finish(slot, drive(self.engine.run(slot), self._perform))

    def until(self, condition: Callable[[], bool]) -> int:
        """Step until ``condition`` holds; how many steps it took."""
        for steps in range(BOUND):
            if condition():
                return steps
            self.step()
        raise AssertionError(f"condition not reached within {BOUND} steps")

    def pending(self) -> int:
        return sum(len(doc.get("outbox") or []) for doc in self.backend.docs.values())

    def emitted(self) -> dict[str, list[int]]:
        return {
            doc["_id"]: list(range(1, doc["outbox_seq"] + 1)) for doc in self.backend.docs.values()
        }


def published_seqs(entries: list[OutboxMessage]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        assert isinstance(entry.aggregate_id, str)
        seqs[entry.aggregate_id].append(entry.seq)
    return dict(seqs)


def test_stream_events_are_published_in_seq_order_trimmed_and_checkpointed() -> None:
    world = Stepped()
    world.start()
    for i in range(30):
        world.write(f"a{i % 5}", f"m{i}", emits=2)
    world.until(lambda: world.pending() == 0 and len(world.publisher.published) == 60)
    # The checkpoint reaches the end of the log (the engine's own trims included).
    world.until(lambda: world.checkpoints.load("t") == len(world.backend.changes))
    assert published_seqs(world.publisher.published) == world.emitted()
    assert world.metrics.totals().published == 60


class OrderCheckingCheckpoints(MemoryCheckpoints):
    """Records a violation if a saved position passes a change whose entries are not out."""

    def __init__(self, world: Stepped) -> None:
        super().__init__()
        self.world = world
        self.violations: list[str] = []

    def save(self, name: str, position: Position) -> None:
        published = set(self.world.publisher.ids())
        quarantined = set(self.world.dead.entries)
        for doc in self.world.backend.changes[:position]:
            current = self.world.backend.docs.get(doc["_id"]) or {}
            still = {e["id"] for e in current.get("outbox") or []}
            for entry in doc.get("outbox") or []:
                if entry["id"] in still or entry["id"] not in published | quarantined:
                    self.violations.append(f"{position}: {entry['id']}")
        super().save(name, position)


def test_checkpoint_never_passes_unpublished_entries_during_an_outage() -> None:
    down = [True]

    def fail(entry: OutboxMessage) -> BaseException | None:
        return BrokerUnavailable("broker down") if down[0] else None

    world = Stepped(MemoryPublisher(fail=fail))
    world.checkpoints = checks = OrderCheckingCheckpoints(world)
    world.start()
    for i in range(20):
        world.write(f"a{i % 4}", f"m{i}")
    for _ in range(60):  # 0.3 simulated seconds of outage
        world.step()
    assert world.publisher.published == []
    assert world.pending() == 20
    assert checks.load("t") in (None, 0)  # the fresh start position at most
    down[0] = False
    world.until(lambda: world.pending() == 0)
    world.until(lambda: checks.load("t") == len(world.backend.changes))
    assert checks.violations == []
    assert published_seqs(world.publisher.published) == world.emitted()
    assert world.dead.entries == {}  # an outage never counts against an entry


def test_a_poison_entry_is_quarantined_and_the_rest_flow() -> None:
    poison: set[str] = set()

    def fail(entry: OutboxMessage) -> BaseException | None:
        return PermanentPublishError("refused") if entry.id in poison else None

    world = Stepped(MemoryPublisher(fail=fail))
    world.write("a", "m0", emits=3)
    poison.add(world.store.get("a").outbox[1].id)
    world.start()
    world.write("b", "m1")
    world.until(lambda: world.pending() == 0)
    assert [e.seq for e in world.publisher.published if e.aggregate_id == "a"] == [1, 3]
    [(entry_id, record)] = world.dead.entries.items()
    assert entry_id in poison and "refused" in record["error"]
    assert world.metrics.totals().quarantined == 1


def test_retried_failures_keep_order_back_off_on_the_clock_and_eventually_quarantine() -> None:
    attempts: dict[str, int] = defaultdict(int)

    def fail(entry: OutboxMessage) -> BaseException | None:
        attempts[entry.id] += 1
        if entry.seq == 2 and attempts[entry.id] <= 2:
            return PublishError("nack")  # succeeds on the third attempt
        if entry.seq == 4:
            return PublishError("nack")  # never: quarantined after max_attempts
        return None

    world = Stepped(MemoryPublisher(fail=fail))
    world.start()
    world.write("a", "m0", emits=4)
    world.until(lambda: world.pending() == 0)
    firsts = [e.seq for e in world.publisher.published]
    assert firsts == [1, 2, 3]  # seq 2 was retried before seq 3 went out (I4)
    [(entry_id, record)] = world.dead.entries.items()
    assert attempts[entry_id] == CONFIG.policy.max_attempts and "nack" in record["error"]
    assert world.slept > 0  # the backoff ran on the simulated clock


def test_a_run_abandoned_in_its_backoff_sleep_keeps_its_entry_pending() -> None:
    """What a stop does to a run sleeping between attempts: the driver raises
    :class:`Abandoned` from the sleep, and the entry stays pending, unquarantined."""
    config = DispatcherConfig(
        name="t",
        poll_interval=STEP,
        policy=DispatchPolicy(max_attempts=50, base_delay=5, max_delay=5),
    )
    world = Stepped(MemoryPublisher(fail=lambda e: PublishError("nack")), config=config)
    engine = world.start()
    world.write("a", "m0")
    slots: list[Any] = []
    while not slots:
        world.now += STEP
        drive(engine.turn(), world._perform)
        slots = engine.start_runs()

    def stopping(op: Any) -> Any:
        if isinstance(op, Sleep):
            assert 0 < op.seconds <= 5  # the jittered backoff
            raise Abandoned
        return world.ports.perform(op)

    with pytest.raises(Abandoned):
        drive(engine.run(slots[0]), stopping)
    assert world.pending() == 1 and world.dead.entries == {}
    assert world.publisher.published == []
