"""Immediate dispatch: entries published right after their commit; the regular dispatcher
remains the safety net, and in one process the two paths do not publish an entry twice."""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, BrokerUnavailable, InvalidConfig, OutboxMessage
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.scheduler import Backoff
from docoutbox.dispatch.extras.immediate import ImmediateDispatcher
from docoutbox.dispatch.extras.settled import SettledPublisher
from docoutbox.store.document import utcnow
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints

FAST = DispatcherConfig(
    name="t",
    concurrency=4,
    sweep_interval=3600,
    poll_interval=0.005,
    checkpoint_interval=0,
    policy=DispatchPolicy(max_attempts=50, base_delay=0.001, max_delay=0.005),
    backoff=Backoff(base=0.005, cap=0.05),
)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def pending(backend: MemoryBackend) -> int:
    return sum(len(doc.get("outbox") or []) for doc in backend.docs.values())


def committed_ids(backend: MemoryBackend) -> set[str]:
    return {e["id"] for doc in backend.changes for e in doc.get("outbox") or []}


def one_trimmed_one_pending(backend: MemoryBackend) -> tuple[OutboxMessage, OutboxMessage]:
    """Two young entries of one commit: the first published and trimmed by the immediate
    path, the second still pending."""
    store = AggregateStore(backend, Counter)
    first, second = store.handle("a", add_msg("m1", emits=2), counter_handlers, create=True).emitted
    store.trim("a", [first.id])
    return first, second


def in_seq_order(entries: list[OutboxMessage]) -> bool:
    """Per aggregate, the first publish of each entry comes in seq order (I4)."""
    firsts: dict[Any, list[int]] = {}
    seen: set[str] = set()
    for entry in entries:
        if entry.id not in seen:
            seen.add(entry.id)
            firsts.setdefault(entry.aggregate_id, []).append(entry.seq)
    return all(seqs == sorted(seqs) for seqs in firsts.values())


def run_dispatcher(backend: MemoryBackend, publisher: Any, *, stream: bool) -> Dispatcher:
    dispatcher = Dispatcher(
        backend,
        publisher,
        MemoryDeadLetters(),
        source=MemoryChangeSource(backend) if stream else None,
        checkpoints=MemoryCheckpoints() if stream else None,
        config=FAST,
    )
    threading.Thread(target=dispatcher.run, daemon=True).start()
    assert dispatcher.started.wait(5)
    return dispatcher


def test_entries_are_published_and_trimmed_right_after_the_commit() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    publisher = MemoryPublisher()
    immediate = ImmediateDispatcher(store, publisher).start()
    for i in range(20):
        store.handle(f"a{i % 3}", add_msg(f"m{i}", emits=2), counter_handlers, create=True)
    immediate.drain()
    immediate.stop()
    assert sorted(publisher.ids()) == sorted(committed_ids(backend))
    assert len(publisher.ids()) == 40
    assert pending(backend) == 0
    assert in_seq_order(publisher.published)
    assert immediate.stats.reloads == 0


def test_a_failed_publish_is_left_to_the_safety_net_in_order() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    broken = {"on": True}
    publisher = MemoryPublisher(
        fail=lambda e: BrokerUnavailable("down") if broken["on"] and e.seq == 3 else None
    )
    immediate = ImmediateDispatcher(store, publisher).start()
    for i in range(6):
        store.handle("a", add_msg(f"m{i}"), counter_handlers, create=True)
    immediate.drain()
    # seq 3 failed: the immediate path stopped for "a" and left 3.. pending.
    assert [e.seq for e in publisher.published] == [1, 2]
    assert immediate.stats.deferred >= 1
    assert pending(backend) == 4
    broken["on"] = False
    dispatcher = run_dispatcher(backend, immediate.guard(publisher), stream=False)
    wait_until(lambda: pending(backend) == 0)
    dispatcher.stop()
    # A new commit after the failure: the immediate path reloads and keeps seq order.
    store.handle("a", add_msg("m6"), counter_handlers)
    immediate.drain()
    immediate.stop()
    assert [e.seq for e in publisher.published] == [1, 2, 3, 4, 5, 6, 7]


def test_crash_of_the_immediate_path_loses_nothing() -> None:
    """The process dies while entries wait for the immediate path: a new process's
    dispatcher publishes every committed entry (I1)."""
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    publisher = MemoryPublisher()
    frozen = threading.Event()

    class Dying(MemoryPublisher):
        """Publishes 10 entries, then the process freezes for good (a crash)."""

        def publish(self, entry: OutboxMessage) -> None:
            if len(self.published) >= 10:
                frozen.wait()
                raise BrokerUnavailable("the process is gone")
            super().publish(entry)

    dying = Dying()
    immediate = ImmediateDispatcher(store, dying).start()
    for i in range(60):
        store.handle(f"a{i % 4}", add_msg(f"m{i}"), counter_handlers, create=True)
    wait_until(lambda: len(dying.published) == 10)
    store.commit_listeners.clear()  # the process and its queue are gone
    assert pending(backend) > 0
    # A new process: its dispatcher (stream + sweep) publishes everything still pending.
    dispatcher = run_dispatcher(backend, publisher, stream=True)
    wait_until(lambda: pending(backend) == 0)
    dispatcher.stop()
    assert committed_ids(backend) == set(dying.ids()) | set(publisher.ids())
    frozen.set()
    immediate.stop()


def test_both_paths_in_one_process_publish_each_entry_once() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    publisher = MemoryPublisher()
    immediate = ImmediateDispatcher(store, publisher).start()
    dispatcher = run_dispatcher(backend, immediate.guard(publisher), stream=True)
    threads = [
        threading.Thread(
            target=lambda w=w: [
                store.handle(f"a{w}", add_msg(f"w{w}-{i}"), counter_handlers, create=True)
                for i in range(40)
            ]
        )
        for w in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    immediate.drain()
    wait_until(lambda: pending(backend) == 0)
    dispatcher.stop()
    immediate.stop()
    counts = Tally(publisher.ids())
    assert set(counts) == committed_ids(backend)
    assert max(counts.values()) == 1
    assert in_seq_order(publisher.published)


def test_settled_publisher_skips_young_entries_the_immediate_path_trimmed() -> None:
    backend = MemoryBackend()
    first, second = one_trimmed_one_pending(backend)
    inner = MemoryPublisher()
    slept: list[float] = []
    settled = SettledPublisher(inner, backend, 0.5, sleep=slept.append)
    settled.publish(first)
    settled.publish(second)
    assert inner.ids() == [second.id] and settled.skipped == 1
    assert len(slept) == 2 and all(0 < s <= 0.5 for s in slept)
    old = SettledPublisher(inner, backend, 0.5, clock=lambda: utcnow() + timedelta(seconds=5))
    old.publish(first)  # old enough: published without a look (at least once)
    assert inner.ids() == [second.id, first.id]


def test_batches_and_group_commits_reach_the_immediate_path() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter, group_commit=True)
    publisher = MemoryPublisher()
    immediate = ImmediateDispatcher(store, publisher).start()
    store.handle_batch("a", [add_msg(f"m{i}") for i in range(5)], counter_handlers, create=True)
    store.handle("a", add_msg("m5"), counter_handlers)
    immediate.drain()
    immediate.stop()
    assert [e.seq for e in publisher.published] == [1, 2, 3, 4, 5, 6]
    assert pending(backend) == 0
    assert immediate.stats.reloads == 0  # every commit was offered, none found by a reload


@pytest.mark.parametrize(
    "build",
    [
        lambda store, pub: ImmediateDispatcher(None, pub),  # accepted, then AttributeError
        lambda store, pub: ImmediateDispatcher(store, None),
        lambda store, pub: ImmediateDispatcher(store, pub, max_batch=0),
        lambda store, pub: ImmediateDispatcher(store, pub, max_queue=-1),
        lambda store, pub: ImmediateDispatcher(store, pub, max_batch=2**31),
        lambda store, pub: ImmediateDispatcher(store, pub, max_queue=2**31),
        lambda store, pub: SettledPublisher(pub, MemoryBackend(), float("nan")),
        lambda store, pub: SettledPublisher(pub, MemoryBackend(), -1.0),
        lambda store, pub: SettledPublisher(object(), MemoryBackend()),
    ],
    ids=[
        "no-store",
        "no-publisher",
        "batch-0",
        "queue-neg",
        "batch-huge",
        "queue-huge",
        "settle-nan",
        "settle-neg",
        "no-publish",
    ],
)
def test_immediate_dispatch_refuses_arguments_it_cannot_use(build: Any) -> None:
    store = AggregateStore(MemoryBackend(), Counter)
    with pytest.raises(InvalidConfig):
        build(store, MemoryPublisher())


class Fatal(BaseException):
    """Not an Exception: it kills the immediate path's worker."""


def test_stop_after_the_worker_died_leaves_its_queue_to_the_safety_net(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dead worker's queue is full: stop() returns at once, and the claims of what it
    held are released, so the regular dispatcher publishes those entries without waiting."""
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    publisher = MemoryPublisher()
    calls: list[str] = []

    class Deadly(MemoryPublisher):
        def publish(self, entry: OutboxMessage) -> None:
            calls.append(entry.id)
            raise Fatal

    immediate = ImmediateDispatcher(store, Deadly(), max_queue=2).start()
    store.handle("a0", add_msg("m0"), counter_handlers, create=True)
    wait_until(lambda: bool(calls))
    time.sleep(0.05)  # the worker is gone
    for i in range(1, 4):
        store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
    began = time.monotonic()
    immediate.stop(timeout=5)
    assert time.monotonic() - began < 2
    assert immediate.stats.deferred == 3  # one refused (queue full), two abandoned
    dispatcher = run_dispatcher(backend, immediate.guard(publisher), stream=False)
    began = time.monotonic()
    wait_until(lambda: pending(backend) == 0)
    dispatcher.stop()
    assert time.monotonic() - began < 5, "the dispatcher waited for stale claims"
    assert sorted(publisher.ids()) == sorted(committed_ids(backend))


def test_drain_without_a_running_worker_returns_and_stop_checks_its_timeout() -> None:
    store = AggregateStore(MemoryBackend(), Counter)
    immediate = ImmediateDispatcher(store, MemoryPublisher())

    def returns(call: Callable[[], None]) -> bool:
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(2)
        return not thread.is_alive()

    assert returns(immediate.drain)  # never started
    assert immediate.start() is immediate.start()
    for bad in (float("nan"), -1.0, "1"):
        with pytest.raises(InvalidConfig):
            immediate.stop(timeout=bad)  # type: ignore[arg-type]
    assert store.commit_listeners == [immediate.offer]  # a refused stop changes nothing
    immediate.stop()
    immediate.stop()
    assert returns(immediate.drain)  # stopped


def test_drain_returns_when_the_worker_dies_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    gate = threading.Event()

    class Deadly(MemoryPublisher):
        def publish(self, entry: OutboxMessage) -> None:
            gate.wait(10)
            raise Fatal

    store = AggregateStore(MemoryBackend(), Counter)
    immediate = ImmediateDispatcher(store, Deadly()).start()
    store.handle("a", add_msg("m0"), counter_handlers, create=True)
    waiting = threading.Thread(target=immediate.drain, daemon=True)
    waiting.start()
    time.sleep(0.1)  # the drain mark is queued behind the commit being published
    gate.set()  # the worker dies on that publish
    waiting.join(2)
    assert not waiting.is_alive()
    immediate.stop()
