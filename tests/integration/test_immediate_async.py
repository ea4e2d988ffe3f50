"""Immediate dispatch on asyncio: the same rules as the threaded path (test_immediate.py),
with the worker, the store and the regular dispatcher on one event loop.

Here: the worker and dispatchers on a real event loop; the pure parts are in
``tests/unit/test_immediate_async.py``.
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from docoutbox import AsyncAggregateStore, OutboxMessage
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.extras.immediate import AsyncImmediateDispatcher
from docoutbox.dispatch.extras.settled import AsyncSettledPublisher
from docoutbox.errors import BrokerUnavailable, InvalidConfig
from docoutbox.store.document import utcnow
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints
from docoutbox.testing.memory import AsyncMemoryBackend
from docoutbox.testing.publisher import AsyncMemoryPublisher
from tests.integration.test_immediate import FAST, Fatal, committed_ids, in_seq_order
from tests.unit.test_immediate import one_trimmed_one_pending, pending


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 30))


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(wait(), timeout)


def start_dispatcher(backend: MemoryBackend, publisher: Any) -> tuple[AsyncDispatcher, Any]:
    """The regular dispatcher (stream and sweep) on the running loop."""
    dispatcher = AsyncDispatcher(
        AsyncMemoryBackend(backend),
        publisher,
        in_thread(MemoryDeadLetters()),
        source=in_thread(MemoryChangeSource(backend)),
        checkpoints=in_thread(MemoryCheckpoints()),
        config=FAST,
    )
    return dispatcher, asyncio.get_running_loop().create_task(dispatcher.run())


def test_entries_are_published_and_trimmed_right_after_the_commit() -> None:
    backend = MemoryBackend()
    publisher = MemoryPublisher()

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = await AsyncImmediateDispatcher(store, AsyncMemoryPublisher(publisher)).start()
        for i in range(20):
            await store.handle(
                f"a{i % 3}", add_msg(f"m{i}", emits=2), counter_handlers, create=True
            )
        await immediate.drain()
        await immediate.stop()
        assert immediate.stats.published == 40 and immediate.stats.reloads == 0

    run(main)
    assert sorted(publisher.ids()) == sorted(committed_ids(backend))
    assert len(publisher.ids()) == 40
    assert pending(backend) == 0
    assert in_seq_order(publisher.published)


def test_a_failed_publish_is_left_to_the_safety_net_in_order() -> None:
    backend = MemoryBackend()
    broken = {"on": True}
    publisher = MemoryPublisher(
        fail=lambda e: BrokerUnavailable("down") if broken["on"] and e.seq == 3 else None
    )

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = await AsyncImmediateDispatcher(store, AsyncMemoryPublisher(publisher)).start()
        for i in range(6):
            await store.handle("a", add_msg(f"m{i}"), counter_handlers, create=True)
        await immediate.drain()
        # seq 3 failed: the immediate path stopped for "a" and left 3.. pending.
        assert [e.seq for e in publisher.published] == [1, 2]
        assert immediate.stats.deferred >= 1 and pending(backend) == 4
        broken["on"] = False
        dispatcher, task = start_dispatcher(
            backend, immediate.guard(AsyncMemoryPublisher(publisher))
        )
        await until(lambda: pending(backend) == 0)
        dispatcher.stop()
        await task
        # A new commit after the failure: the immediate path reloads and keeps seq order.
        await store.handle("a", add_msg("m6"), counter_handlers)
        await immediate.drain()
        await immediate.stop()
        assert immediate.stats.reloads == 1

    run(main)
    assert [e.seq for e in publisher.published] == [1, 2, 3, 4, 5, 6, 7]


def test_both_paths_on_one_loop_publish_each_entry_once() -> None:
    """The regular dispatcher waits for the immediate path's claims without blocking the
    loop that path runs on: blocking it would stall both paths, then publish twice."""
    backend = MemoryBackend()
    publisher = MemoryPublisher()

    class Slow(AsyncMemoryPublisher):
        """The immediate path's broker: slow enough that the stream sees its entries."""

        async def publish(self, entry: OutboxMessage) -> None:
            await asyncio.sleep(0.002)
            await super().publish(entry)

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = await AsyncImmediateDispatcher(store, Slow(publisher)).start()
        guarded = immediate.guard(AsyncMemoryPublisher(publisher))
        dispatcher, task = start_dispatcher(backend, guarded)

        async def produce(w: int) -> None:
            for i in range(40):
                await store.handle(f"a{w}", add_msg(f"w{w}-{i}"), counter_handlers, create=True)
                await asyncio.sleep(0)

        await asyncio.gather(*(produce(w) for w in range(4)))
        await immediate.drain()
        assert immediate.stats.published > 0 and guarded.skipped > 0  # both paths met
        await until(lambda: pending(backend) == 0)
        dispatcher.stop()
        await task
        await immediate.stop()

    run(main)
    counts = Tally(publisher.ids())
    assert set(counts) == committed_ids(backend)
    assert max(counts.values()) == 1
    assert in_seq_order(publisher.published)


def test_a_full_queue_leaves_the_commits_to_the_safety_net() -> None:
    backend = MemoryBackend()
    publisher = MemoryPublisher()

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = AsyncImmediateDispatcher(store, AsyncMemoryPublisher(publisher), max_queue=2)
        await immediate.start()
        # The worker task does not run between these commits: the queue holds two.
        for i in range(5):
            await store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
        assert immediate.stats.deferred == 3
        await immediate.drain()
        await immediate.stop()

    run(main)
    assert len(publisher.ids()) == 2
    assert pending(backend) == 3  # still in their documents: nothing is lost


def test_stop_finishes_what_is_queued() -> None:
    backend = MemoryBackend()
    publisher = MemoryPublisher()

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = await AsyncImmediateDispatcher(store, AsyncMemoryPublisher(publisher)).start()
        for i in range(10):
            await store.handle("a", add_msg(f"m{i}"), counter_handlers, create=True)
        await immediate.stop()
        await store.handle("a", add_msg("late"), counter_handlers)  # detached: not offered

    run(main)
    assert [e.seq for e in publisher.published] == list(range(1, 11))
    assert pending(backend) == 1


def test_settled_publisher_skips_young_entries_the_immediate_path_trimmed() -> None:

    backend = MemoryBackend()
    first, second = one_trimmed_one_pending(backend)
    inner = MemoryPublisher()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def main() -> None:
        settled = AsyncSettledPublisher(
            AsyncMemoryPublisher(inner), AsyncMemoryBackend(backend), 0.5, sleep=sleep
        )
        await settled.publish(first)
        await settled.publish(second)
        assert inner.ids() == [second.id] and settled.skipped == 1
        assert len(slept) == 2 and all(0 < s <= 0.5 for s in slept)
        old = AsyncSettledPublisher(
            AsyncMemoryPublisher(inner),
            AsyncMemoryBackend(backend),
            0.5,
            clock=lambda: utcnow() + timedelta(seconds=5),
        )
        await old.publish(first)  # old enough: published without a look (at least once)
        assert inner.ids() == [second.id, first.id] and len(slept) == 2

    run(main)


def test_a_sync_publisher_in_a_thread_is_accepted() -> None:
    backend = MemoryBackend()
    publisher = MemoryPublisher()

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = await AsyncImmediateDispatcher(store, in_thread(publisher)).start()
        await store.handle("a", add_msg("m1"), counter_handlers, create=True)
        await immediate.drain()
        await immediate.stop()

    run(main)
    assert len(publisher.ids()) == 1 and pending(backend) == 0


def test_stop_after_the_worker_died_leaves_its_queue_to_the_safety_net(
    caplog: pytest.LogCaptureFixture,
) -> None:

    backend = MemoryBackend()
    publisher = MemoryPublisher()

    class Deadly(AsyncMemoryPublisher):
        async def publish(self, entry: OutboxMessage) -> None:
            raise Fatal

    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        immediate = await AsyncImmediateDispatcher(store, Deadly(), max_queue=2).start()
        await store.handle("a0", add_msg("m0"), counter_handlers, create=True)
        await asyncio.sleep(0.05)  # the worker task died on its first publish
        for i in range(1, 4):
            await store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
        await asyncio.wait_for(immediate.stop(timeout=5), 2)
        assert immediate.stats.deferred == 3  # one refused (queue full), two abandoned
        dispatcher, task = start_dispatcher(
            backend, immediate.guard(AsyncMemoryPublisher(publisher))
        )
        await until(lambda: pending(backend) == 0, timeout=5)
        dispatcher.stop()
        await task

    run(main)
    assert sorted(publisher.ids()) == sorted(committed_ids(backend))
    assert "immediate_worker_failed" in caplog.text


def test_drain_without_a_running_worker_returns_and_stop_checks_its_timeout() -> None:
    async def main() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(), Counter)
        immediate = AsyncImmediateDispatcher(store, AsyncMemoryPublisher())
        await asyncio.wait_for(immediate.drain(), 1)  # never started
        assert await immediate.start() is await immediate.start()
        for bad in (float("nan"), -1.0, "1"):
            with pytest.raises(InvalidConfig):
                await immediate.stop(timeout=bad)  # type: ignore[arg-type]
        assert store.commit_listeners == [immediate.offer]  # a refused stop changes nothing
        await immediate.stop()
        await immediate.stop()
        await asyncio.wait_for(immediate.drain(), 1)  # stopped

    run(main)


def test_a_crash_of_the_immediate_path_loses_nothing() -> None:
    """The event loop ends while entries wait for the immediate path (its worker task is
    cancelled mid-publish): a new process's dispatcher publishes every committed entry."""
    backend = MemoryBackend()
    dying, publisher = MemoryPublisher(), MemoryPublisher()

    class Stuck(AsyncMemoryPublisher):
        """Publishes 10 entries, then never returns."""

        async def publish(self, entry: OutboxMessage) -> None:
            if len(self.sync.published) >= 10:
                await asyncio.Event().wait()
            await super().publish(entry)

    async def doomed() -> None:
        store = AsyncAggregateStore(AsyncMemoryBackend(backend), Counter)
        await AsyncImmediateDispatcher(store, Stuck(dying)).start()
        for i in range(60):
            await store.handle(f"a{i % 4}", add_msg(f"m{i}"), counter_handlers, create=True)
        await until(lambda: len(dying.published) == 10)
        # Returning ends the loop: asyncio.run cancels the worker, as a crash would stop it.

    run(doomed)
    # Its batch was never trimmed: the 10 it published are published again (at least once).
    assert pending(backend) == 60

    async def restarted() -> None:
        dispatcher, task = start_dispatcher(backend, AsyncMemoryPublisher(publisher))
        await until(lambda: pending(backend) == 0)
        dispatcher.stop()
        await task

    run(restarted)
    assert committed_ids(backend) == set(dying.ids()) | set(publisher.ids())


def test_drain_returns_when_the_worker_dies_meanwhile() -> None:

    async def main() -> None:
        gate = asyncio.Event()

        class Deadly(AsyncMemoryPublisher):
            async def publish(self, entry: OutboxMessage) -> None:
                await gate.wait()
                raise Fatal

        store = AsyncAggregateStore(AsyncMemoryBackend(), Counter)
        immediate = await AsyncImmediateDispatcher(store, Deadly()).start()
        await store.handle("a", add_msg("m0"), counter_handlers, create=True)
        waiting = asyncio.ensure_future(immediate.drain())
        await asyncio.sleep(0.05)  # the drain mark is queued behind the commit
        gate.set()  # the worker dies on that publish
        await asyncio.wait_for(waiting, 2)
        await immediate.stop()

    run(main)
