"""Group commit: concurrent handle calls on one aggregate share writes instead of racing."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from docoutbox import (
    AggregateStore,
    AsyncAggregateStore,
    Message,
    NotFound,
    RetryPolicy,
    StoreConfig,
    UnknownMessageType,
)
from docoutbox.store.plans import WritePlan
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers

WRITERS = 16
PER_WRITER = 25


class Slow(MemoryBackend):
    """Every round trip takes a little while, as on a network: writers overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def load(self, aggregate_id: Any) -> Any:
        time.sleep(0.0005)
        return super().load(aggregate_id)

    def write(self, plan: WritePlan) -> bool:
        time.sleep(0.001)
        self.writes += 1
        return super().write(plan)


def _run_threads(store: AggregateStore[Counter], per_writer: int = PER_WRITER) -> list[Any]:
    outcomes: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            for i in range(per_writer):
                out = store.handle("hot", add_msg(f"w{w}-{i}"), counter_handlers)
                with lock:
                    outcomes.append(out)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return outcomes


def test_sixteen_threads_on_one_aggregate_never_give_up() -> None:
    backend = Slow()
    store = AggregateStore(backend, Counter, group_commit=True)
    store.create("hot", Counter())
    outcomes = _run_threads(store)
    assert len(outcomes) == WRITERS * PER_WRITER
    assert all(o.applied for o in outcomes)
    state = store.get("hot").state
    assert state.total == WRITERS * PER_WRITER
    assert len(set(state.applied)) == len(state.applied) == WRITERS * PER_WRITER
    # Writers took turns in batches: far fewer writes than messages, and no lost race.
    assert backend.writes < WRITERS * PER_WRITER / 2
    assert all(o.attempts == 1 for o in outcomes)


def test_without_group_commit_the_same_writers_race() -> None:
    """The baseline the option exists for: writers conflict and retry."""
    backend = Slow()
    retry = RetryPolicy(max_attempts=1000, base_delay=0.0005)
    store = AggregateStore(backend, Counter, StoreConfig(retry=retry))
    store.create("hot", Counter())
    outcomes = _run_threads(store, per_writer=3)
    assert all(o.applied for o in outcomes)
    assert sum(o.attempts for o in outcomes) > len(outcomes)


def test_a_failing_handler_raises_only_in_its_caller() -> None:
    store = AggregateStore(Slow(), Counter, group_commit=True)
    store.create("hot", Counter())
    results: dict[str, Any] = {}
    barrier = threading.Barrier(8)

    def call(name: str, message: Message) -> None:
        barrier.wait()
        try:
            results[name] = store.handle("hot", message, counter_handlers)
        except UnknownMessageType as exc:
            results[name] = exc

    threads = [
        threading.Thread(
            target=call, args=(f"c{i}", Message(id=f"m{i}", type="Boom" if i == 3 else "Add"))
        )
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["c3"], UnknownMessageType)
    assert all(results[f"c{i}"].applied for i in range(8) if i != 3)
    assert sorted(store.get("hot").state.applied) == sorted(f"m{i}" for i in range(8) if i != 3)


def test_missing_aggregate_raises_not_found_in_group_mode() -> None:
    store = AggregateStore(MemoryBackend(), Counter, group_commit=True)
    with pytest.raises(NotFound):
        store.handle("nobody", add_msg("m1"), counter_handlers)
    assert store.handle("nobody", add_msg("m1"), counter_handlers, create=True).applied


def test_redelivery_in_group_mode_is_a_duplicate() -> None:
    store = AggregateStore(MemoryBackend(), Counter, group_commit=True)
    store.handle("a", add_msg("m1"), counter_handlers, create=True)
    assert store.handle("a", add_msg("m1"), counter_handlers).duplicate


class SlowAsync(AsyncMemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def load(self, aggregate_id: Any) -> Any:
        await asyncio.sleep(0.0005)
        return await super().load(aggregate_id)

    async def write(self, plan: WritePlan) -> bool:
        await asyncio.sleep(0.001)
        self.writes += 1
        return await super().write(plan)


def test_sixteen_tasks_on_one_aggregate_share_writes() -> None:
    async def main() -> None:
        backend = SlowAsync()
        store = AsyncAggregateStore(backend, Counter, group_commit=True)
        await store.create("hot", Counter())

        async def writer(w: int) -> list[Any]:
            return [
                await store.handle("hot", add_msg(f"w{w}-{i}"), counter_handlers)
                for i in range(PER_WRITER)
            ]

        results = await asyncio.gather(*(writer(w) for w in range(WRITERS)))
        outcomes = [o for batch in results for o in batch]
        assert all(o.applied and o.attempts == 1 for o in outcomes)
        state = (await store.get("hot")).state
        assert len(set(state.applied)) == WRITERS * PER_WRITER
        assert backend.writes < WRITERS * PER_WRITER / 2

    asyncio.run(main())


def test_a_cancelled_task_does_not_stall_the_others() -> None:
    async def main() -> None:
        backend = SlowAsync()
        store = AsyncAggregateStore(backend, Counter, group_commit=True)
        await store.create("hot", Counter())
        tasks = [
            asyncio.create_task(store.handle("hot", add_msg(f"m{i}"), counter_handlers))
            for i in range(10)
        ]
        await asyncio.sleep(0)
        tasks[4].cancel()
        tasks[0].cancel()  # the first leader, in the middle of its write
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        # Only the cancelled callers see the cancellation; the leader's batch is requeued.
        cancelled = [i for i, d in enumerate(done) if isinstance(d, asyncio.CancelledError)]
        assert cancelled == [0, 4]
        assert all(d.applied for d in done if not isinstance(d, BaseException))
        # More work still flows through the aggregate afterwards.
        assert (await store.handle("hot", add_msg("after"), counter_handlers)).applied

    asyncio.run(main())


def test_an_interrupted_leader_hands_its_batch_to_the_next() -> None:
    """The leader's thread is interrupted mid-write: the callers queued with it are
    handled by the next leader and none of them sees the interruption."""

    class Interrupt(BaseException):
        pass

    class Breaking(Slow):
        def __init__(self) -> None:
            super().__init__()
            self.armed = True

        def write(self, plan: WritePlan) -> bool:
            if self.armed and threading.current_thread().name == "leader":
                self.armed = False
                raise Interrupt
            if threading.current_thread().name == "first":
                time.sleep(0.05)  # the others queue up behind this write
            return super().write(plan)

    store = AggregateStore(Breaking(), Counter, group_commit=True)
    store.create("hot", Counter())
    results: dict[int, Any] = {}

    def call(i: int) -> None:
        try:
            results[i] = store.handle("hot", add_msg(f"m{i}"), counter_handlers)
        except Interrupt as exc:
            results[i] = exc

    first = threading.Thread(target=call, args=(9,), name="first")
    first.start()
    time.sleep(0.01)
    leader = threading.Thread(target=call, args=(0,), name="leader")
    leader.start()  # queued first: it leads the next batch, which holds everybody
    time.sleep(0.01)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 6)]
    for t in others:
        t.start()
    for t in [first, leader, *others]:
        t.join(10)
    assert isinstance(results[0], Interrupt)
    assert all(results[i].applied for i in range(1, 6))
    assert sorted(store.get("hot").state.applied) == [f"m{i}" for i in (1, 2, 3, 4, 5, 9)]
