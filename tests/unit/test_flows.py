"""The handle flow against a scripted backend: retries, transient errors, the cache."""

from __future__ import annotations

import random
from typing import Any

import pytest

from docoutbox import (
    AggregateStore,
    AsyncAggregateStore,
    InboxPolicy,
    Message,
    RetryPolicy,
    Status,
    StoreConfig,
)
from docoutbox.errors import DocumentTooLarge, InvalidConfig, TransientStoreError
from docoutbox.store.plans import CommitPlan, WritePlan
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_mongo.backend import bson_size
from tests.support import loopless


class Scripted(MemoryBackend):
    """A memory backend that counts calls and can fail on cue."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.writes = 0
        self.fail_loads = 0
        self.fail_writes_after_applying = 0
        self.reject_writes = 0
        self.fail_writes = 0

    def load(self, aggregate_id: Any) -> Any:
        self.loads += 1
        if self.fail_loads:
            self.fail_loads -= 1
            raise TransientStoreError("network blip")
        return super().load(aggregate_id)

    def write(self, plan: WritePlan) -> bool:
        self.writes += 1
        if self.fail_writes:
            self.fail_writes -= 1
            raise TransientStoreError("no reply, nothing written")
        if self.reject_writes and isinstance(plan, CommitPlan):
            self.reject_writes -= 1
            return False
        applied = super().write(plan)
        if self.fail_writes_after_applying:
            self.fail_writes_after_applying -= 1
            raise TransientStoreError("reply lost")
        return applied


def make(backend: Scripted, attempts: int = 5, **config: Any) -> AggregateStore[Counter]:
    retry = RetryPolicy(max_attempts=attempts, base_delay=0.001)
    return AggregateStore(
        backend, Counter, StoreConfig(retry=retry, **config), sleep=lambda s: None
    )


def test_one_round_trip_when_the_cached_document_is_current() -> None:
    backend = Scripted()
    store = make(backend)
    store.create("c", Counter())
    store.handle("c", add_msg("m1"), counter_handlers)
    loads, writes = backend.loads, backend.writes
    store.handle("c", add_msg("m2"), counter_handlers)
    assert (backend.loads - loads, backend.writes - writes) == (0, 1)


def test_without_cache_two_round_trips() -> None:
    backend = Scripted()
    store = make(backend, cache_size=0)
    store.create("c", Counter())
    loads, writes = backend.loads, backend.writes
    store.handle("c", add_msg("m1"), counter_handlers)
    assert (backend.loads - loads, backend.writes - writes) == (1, 1)


def test_a_lost_reply_after_an_applied_write_is_settled_from_the_document() -> None:
    """The reload finds the very document the write produced: APPLIED, with its entries
    (a commit listener publishes them), not a duplicate, and not counted as a conflict."""
    backend = Scripted()
    store = make(backend)
    store.create("c", Counter())
    backend.fail_writes_after_applying = 1
    outcome = store.handle("c", add_msg("m1", emits=2), counter_handlers)
    assert outcome.status is Status.APPLIED and outcome.attempts == 1
    stored = store.get("c")
    assert stored.state.total == 1  # applied once, not twice
    assert [e.id for e in outcome.emitted] == [e.id for e in stored.outbox]


class Resending(MemoryBackend):
    """A driver that resends a write whose reply it lost (as azure.cosmos.aio does): the
    first write applies, its reply is lost, the resend meets its own write and is refused
    as a conflict (409/412), which is all the store hears."""

    def __init__(self, *, lose_reply: bool = False) -> None:
        super().__init__()
        self.resends = 0
        self.lose_reply = lose_reply
        self.refuse = 0

    def write(self, plan: WritePlan) -> bool:
        if self.refuse and isinstance(plan, CommitPlan):
            self.refuse -= 1
            return False  # a genuine conflict: nothing written
        applied = super().write(plan)
        if not (applied and self.resends):
            return applied
        self.resends -= 1
        if self.lose_reply:
            raise TransientStoreError("reply lost")
        return super().write(plan)  # the resend: the version guard refuses it


@pytest.mark.parametrize("lose_reply", [False, True], ids=["resend-conflicts", "reply-lost"])
@pytest.mark.parametrize("first_write", ["insert", "commit"])
def test_a_write_in_doubt_on_the_last_attempt_is_read_back_before_answering(
    lose_reply: bool, first_write: str
) -> None:
    """With no attempt left, a conflict or a lost reply was answered GAVE_UP ("nothing
    was written") or raised, though the message was in the stored inbox."""
    backend = Resending(lose_reply=lose_reply)
    store = make(backend, attempts=1)
    if first_write == "commit":
        store.create("c", Counter())
    backend.resends = 1
    outcome = store.handle("c", add_msg("m1", emits=1), counter_handlers, create=True)
    assert outcome.status is Status.APPLIED
    stored = store.get("c")
    assert stored.state.applied == ["m1"] and [e.id for e in stored.outbox] == [
        e.id for e in outcome.emitted
    ]


def test_a_write_in_doubt_that_did_not_land_still_gives_up_or_raises() -> None:
    backend = Resending()
    store = make(backend, attempts=1)
    store.create("c", Counter())
    backend.refuse = 1  # a real conflict on the only attempt
    assert store.handle("c", add_msg("m1"), counter_handlers).status is Status.GAVE_UP
    scripted = Scripted()
    store = make(scripted, attempts=1)
    store.create("c", Counter())
    scripted.fail_writes = 1  # no reply, nothing written
    with pytest.raises(TransientStoreError):
        store.handle("c", add_msg("m1"), counter_handlers)
    assert store.get("c").version == 0


def test_the_async_store_settles_a_resend_conflict_the_same_way() -> None:

    backend = Resending()
    retry = RetryPolicy(max_attempts=1, base_delay=0.001)
    store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter, StoreConfig(retry=retry))

    async def scenario() -> Status:
        await store.create("c", Counter())
        backend.resends = 1
        return (await store.handle("c", add_msg("m1"), counter_handlers)).status

    assert loopless.run(scenario()) is Status.APPLIED


def test_transient_load_errors_are_retried_then_raised() -> None:
    backend = Scripted()
    store = make(backend, attempts=3, cache_size=0)
    store.create("c", Counter())
    backend.fail_loads = 2
    assert store.handle("c", add_msg("m1"), counter_handlers).applied
    backend.fail_loads = 3
    with pytest.raises(TransientStoreError):
        store.handle("c", add_msg("m2"), counter_handlers)


class Ticking:
    """A monotonic clock that moves ``step`` seconds at every reading."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_transient_errors_are_retried_until_the_deadline_then_raised_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unreachable database: each attempt fails after a while; the call stops retrying
    once ``RetryPolicy.deadline`` has passed, long before ``max_attempts``, and the store
    warns once, naming the bound."""
    backend = Scripted()
    clock = Ticking(step=8.0)  # each attempt "takes" 8 s
    retry = RetryPolicy(max_attempts=100, base_delay=0.001, deadline=30.0)
    store = AggregateStore(
        backend, Counter, StoreConfig(retry=retry, cache_size=0, timer=clock), sleep=lambda s: None
    )
    store.create("c", Counter())
    backend.fail_loads = 1000
    with caplog.at_level("WARNING", logger="docoutbox.store"):
        with pytest.raises(TransientStoreError, match=r"RetryPolicy.deadline=30 s"):
            store.handle("c", add_msg("m1"), counter_handlers)
        assert backend.loads == 4  # 8, 16, 24 s retried; 32 s is past the deadline
        with pytest.raises(TransientStoreError):
            store.handle("c", add_msg("m1"), counter_handlers)
    warnings = [r for r in caplog.records if r.name == "docoutbox.store"]
    assert len(warnings) == 1 and "RetryPolicy.deadline" in warnings[0].getMessage()
    assert "30 s" in warnings[0].getMessage()


def test_lost_write_replies_are_bounded_by_the_deadline_too() -> None:
    backend = Scripted()
    retry = RetryPolicy(max_attempts=100, base_delay=0.001, deadline=30.0)
    config = StoreConfig(retry=retry, timer=Ticking(step=8.0))
    store = AggregateStore(backend, Counter, config, sleep=lambda s: None)
    store.create("c", Counter())
    backend.fail_writes = 1000
    with pytest.raises(TransientStoreError, match="deadline"):
        store.handle("c", add_msg("m1"), counter_handlers)
    assert backend.writes == 1 + 4  # the create, then writes at 8, 16, 24 and 32 s


def test_a_batch_fails_its_messages_at_the_deadline() -> None:
    backend = Scripted()
    retry = RetryPolicy(max_attempts=100, base_delay=0.001, deadline=30.0)
    config = StoreConfig(retry=retry, cache_size=0, timer=Ticking(step=8.0))
    store = AggregateStore(backend, Counter, config, sleep=lambda s: None)
    store.create("c", Counter())
    backend.fail_loads = 1000
    outcome = store.handle_batch("c", [add_msg("m1"), add_msg("m2")], counter_handlers)
    errors = [getattr(result, "error", None) for result in outcome.results]
    assert all(isinstance(e, TransientStoreError) and "deadline" in str(e) for e in errors)
    assert backend.loads == 4


def test_without_a_deadline_only_max_attempts_bounds_transient_retries() -> None:
    backend = Scripted()
    retry = RetryPolicy(max_attempts=7, base_delay=0.001, deadline=None)
    config = StoreConfig(retry=retry, cache_size=0, timer=Ticking(step=1000.0))
    store = AggregateStore(backend, Counter, config, sleep=lambda s: None)
    store.create("c", Counter())
    backend.fail_loads = 1000
    with pytest.raises(TransientStoreError):
        store.handle("c", add_msg("m1"), counter_handlers)
    assert backend.loads == 7


@pytest.mark.parametrize("deadline", [0, -1.0, float("nan"), "30", True])
def test_a_deadline_must_be_a_positive_number_of_seconds(deadline: Any) -> None:
    with pytest.raises(InvalidConfig):
        RetryPolicy(deadline=deadline)
    with pytest.raises(InvalidConfig):
        StoreConfig(timer=deadline)


def test_gives_up_after_bounded_conflicts_and_writes_nothing() -> None:
    backend = Scripted()
    store = make(backend, attempts=4)
    store.create("c", Counter())
    backend.reject_writes = 10
    outcome = store.handle("c", add_msg("m1"), counter_handlers)
    assert outcome.status is Status.GAVE_UP
    assert outcome.attempts == 4
    assert store.get("c").version == 0


def test_backoff_grows_and_is_jittered() -> None:
    slept: list[float] = []
    backend = Scripted()
    retry = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)
    store = AggregateStore(
        backend, Counter, StoreConfig(retry=retry, cache_size=0), sleep=slept.append
    )
    store.create("c", Counter())
    backend.reject_writes = 10
    store.handle("c", add_msg("m1"), counter_handlers)
    assert len(slept) == 5
    caps = [min(0.05, 0.01 * 2**i) for i in range(5)]
    assert all(0 <= s <= cap for s, cap in zip(slept, caps, strict=True))


def test_stale_cache_reloads_without_sleeping() -> None:
    slept: list[float] = []
    backend = Scripted()
    store = AggregateStore(backend, Counter, sleep=slept.append)
    other = AggregateStore(backend, Counter)
    store.create("c", Counter())
    store.handle("c", add_msg("m1"), counter_handlers)
    other.handle("c", add_msg("m2"), counter_handlers)
    outcome = store.handle("c", add_msg("m3"), counter_handlers)
    assert outcome.applied and outcome.attempts == 2
    assert slept == []


def blob(message_id: str, size: int) -> Message:
    return Message(id=message_id, type="Add", payload={"n": 1, "blob": "x" * size})


def test_size_guard_rechecks_a_cached_document_before_refusing() -> None:
    backend = Scripted()
    backend.max_document_bytes = 6000
    store = make(backend)
    store.create("c", Counter())
    first = store.handle("c", blob("m1", 3000), counter_handlers)
    # Another process publishes and trims; our cache still holds the big entry.
    AggregateStore(backend, Counter).trim("c", [e.id for e in first.emitted])
    loads = backend.loads
    assert store.handle("c", blob("m2", 3000), counter_handlers).applied
    assert backend.loads == loads + 1  # the cached copy looked too large: reloaded once
    with pytest.raises(DocumentTooLarge):
        store.handle("c", blob("m3", 4000), counter_handlers)
    assert store.get("c").version == 2


def test_a_cached_copy_with_a_long_backlog_is_not_kept() -> None:
    """Trims do not bump the version, so a cached backlog would only grow: reload instead."""
    backend = Scripted()
    store = make(backend)
    store.create("c", Counter())
    for i in range(64):
        store.handle("c", add_msg(f"m{i}"), counter_handlers)
    loads = backend.loads
    store.handle("c", add_msg("m64"), counter_handlers)  # from the cache: 64 pending before
    assert backend.loads == loads
    store.handle("c", add_msg("m65"), counter_handlers)  # 65 pending: that copy was dropped
    assert backend.loads == loads + 1


def test_the_cached_size_bound_never_underestimates() -> None:
    """Long message IDs make the state grow by more than the slack on every commit."""
    rng = random.Random(3)
    backend = Scripted()
    backend.document_size = bson_size  # type: ignore[method-assign]
    store = make(backend, inbox=InboxPolicy(window=5))
    store.create("c", Counter())
    checked = 0
    for i in range(120):
        payload = {"n": 1, "emits": rng.randint(0, 2), "blob": "x" * rng.choice([0, 10, 900])}
        message = Message(id=f"{i:04d}" + "m" * 300, type="Add", payload=payload)
        store.handle("c", message, counter_handlers)
        cached = store._core.cache.take("c")
        if cached is not None:  # None once the cached copy holds a long backlog
            doc, bound, state = cached
            assert bound is not None
            assert bound >= bson_size(doc)
            store._core.cache.put("c", doc, bound, state)
            checked += 1
        if rng.random() < 0.3:
            store.trim("c", [e.id for e in store.get("c").outbox])
    assert checked > 50


def test_the_cached_size_bound_covers_watermarks_and_an_empty_commit() -> None:
    """Exact de-duplication rewrites the marks on every commit; some commits add no entry.

    The bound counts only the parts a commit adds, so it must still cover marks that grow
    (sources arriving out of order keep numbers above the watermark) and bare state
    changes.
    """
    rng = random.Random(9)
    backend = Scripted()
    backend.document_size = bson_size  # type: ignore[method-assign]
    store = make(backend, inbox=InboxPolicy(window=0, exact=True, max_above=500))
    store.create("c", Counter())
    seqs = {f"source-{s}" + "s" * 200: list(range(1, 60)) for s in range(4)}
    for numbers in seqs.values():
        rng.shuffle(numbers)
    checked = 0
    for i in range(200):
        source = rng.choice([s for s, left in seqs.items() if left])
        seq = seqs[source].pop()
        payload = {"n": 1, "emits": rng.choice([0, 0, 1]), "blob": "x" * rng.choice([0, 400])}
        message = Message(id=f"m{i}", type="Add", payload=payload, source=source, seq=seq)
        assert store.handle("c", message, counter_handlers).applied
        cached = store._core.cache.take("c")
        if cached is not None:
            doc, bound, state = cached
            assert bound is not None
            assert bound >= bson_size(doc)
            assert bound >= bson_size(backend.load("c"))
            store._core.cache.put("c", doc, bound, state)
            checked += 1
        if rng.random() < 0.3:
            store.trim("c", [e.id for e in store.get("c").outbox])
        if not any(seqs.values()):
            break
    assert checked > 100


@pytest.mark.parametrize("lose_reply", [False, True], ids=["resend-conflicts", "reply-lost"])
def test_a_batch_write_in_doubt_on_the_last_attempt_is_read_back(lose_reply: bool) -> None:
    """handle_batch's last write applied, then conflicted with its own resend (or lost its
    reply): its messages are in the stored inbox, so they are duplicates, not GAVE_UP or
    failed."""
    backend = Resending(lose_reply=lose_reply)
    store = make(backend, attempts=1)
    store.create("c", Counter())
    backend.resends = 1
    outcome = store.handle_batch("c", [add_msg("m1"), add_msg("m2")], counter_handlers)
    assert [r.status for r in outcome.results] == ["duplicate", "duplicate"]
    assert store.get("c").state.applied == ["m1", "m2"]
    backend.refuse = 1  # a genuine conflict on the last attempt: still given up
    outcome = store.handle_batch("c", [add_msg("m3")], counter_handlers)
    assert [r.status for r in outcome.results] == ["gave_up"]
