"""Batch handling: one load, one conditional write for many messages of one aggregate."""

from __future__ import annotations

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
from docoutbox.errors import DocumentTooLarge, TransientStoreError, UnknownMessageType
from docoutbox.store.batch import Failed
from docoutbox.store.plans import CommitPlan, InsertPlan, WritePlan
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from tests.support import loopless


class Crash(BaseException):
    """The process dies: nothing after this point runs."""


class Faulty(MemoryBackend):
    """A memory backend that counts round trips and fails on cue."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loads = 0
        self.writes = 0
        self.crash_before_write = 0
        self.fail_after_applying = 0
        self.reject = 0

    def load(self, aggregate_id: Any) -> Any:
        self.loads += 1
        return super().load(aggregate_id)

    def write(self, plan: WritePlan) -> bool:
        self.writes += 1
        if self.crash_before_write:
            self.crash_before_write -= 1
            raise Crash
        if self.reject and isinstance(plan, CommitPlan):
            self.reject -= 1
            return False
        applied = super().write(plan)
        if self.fail_after_applying:
            self.fail_after_applying -= 1
            raise TransientStoreError("reply lost")
        return applied


def make(backend: MemoryBackend, **config: Any) -> AggregateStore[Counter]:
    retry = RetryPolicy(max_attempts=5, base_delay=0.0001)
    return AggregateStore(
        backend, Counter, StoreConfig(retry=retry, **config), sleep=lambda s: None
    )


def boom(message_id: str) -> Message:
    return Message(id=message_id, type="Boom")


def test_a_batch_is_one_load_and_one_write() -> None:
    backend = Faulty()
    store = make(backend)
    messages = [add_msg(f"m{i}", n=i, emits=2) for i in range(10)]
    result = store.handle_batch("c1", messages, counter_handlers, create=True)
    assert [r.status for r in result.results] == [Status.APPLIED] * 10
    assert (result.loads, result.writes, result.commits) == (1, 1, 1)
    assert (backend.loads, backend.writes) == (1, 1)
    snap = store.get("c1")
    assert snap.state.total == sum(range(10))
    assert snap.state.applied == [f"m{i}" for i in range(10)]
    assert snap.version == 1  # one commit, as a single handle would make
    assert [e.seq for e in snap.outbox] == list(range(1, 21))
    assert list(snap.inbox) == [f"m{i}" for i in range(10)]
    # Each message reports its own entries and the state right after it.
    third = result.results[3]
    assert not isinstance(third, Failed)
    assert [e["seq"] for e in third.entries] == [7, 8]
    assert third.state is not None and third.state.total == 0 + 1 + 2 + 3


def test_redelivery_of_a_batch_applies_nothing_twice() -> None:
    backend = Faulty()
    store = make(backend)
    store.handle_batch("c1", [add_msg("m1"), add_msg("m2")], counter_handlers, create=True)
    writes = backend.writes
    again = store.handle_batch(
        "c1", [add_msg("m1"), add_msg("m3"), add_msg("m2"), add_msg("m3")], counter_handlers
    )
    assert [r.status for r in again.results] == [
        Status.DUPLICATE,
        Status.APPLIED,
        Status.DUPLICATE,
        Status.DUPLICATE,
    ]
    assert backend.writes == writes + 1
    assert store.get("c1").state.applied == ["m1", "m2", "m3"]


def test_a_failing_handler_mid_batch_gets_its_error_and_the_rest_commits() -> None:
    backend = Faulty()
    store = make(backend)
    store.create("c1", Counter())
    messages = [add_msg("m1", n=1), add_msg("m2", n=2), boom("bad"), add_msg("m4", n=4)]
    result = store.handle_batch("c1", messages, counter_handlers)
    statuses = [r.status for r in result.results]
    assert statuses == [Status.APPLIED, Status.APPLIED, "failed", Status.APPLIED]
    failed = result.results[2]
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, UnknownMessageType)
    assert result.failed == (failed,)
    snap = store.get("c1")
    assert snap.state.applied == ["m1", "m2", "m4"]
    assert "bad" not in snap.inbox  # not applied: a redelivery will try it again
    assert result.commits == 1


def test_a_failing_handler_alone_writes_nothing() -> None:
    backend = Faulty()
    store = make(backend)
    store.create("c1", Counter())
    writes = backend.writes
    result = store.handle_batch("c1", [boom("bad")], counter_handlers)
    assert isinstance(result.results[0], Failed)
    assert backend.writes == writes


def test_crash_between_load_and_commit_leaves_nothing_half_applied() -> None:
    backend = Faulty()
    store = make(backend)
    store.create("c1", Counter())
    before = backend.load("c1")
    backend.crash_before_write = 1
    messages = [add_msg(f"m{i}", emits=1) for i in range(5)]
    with pytest.raises(Crash):
        store.handle_batch("c1", messages, counter_handlers)
    assert backend.load("c1") == before
    # A new process (no cache) receives the whole batch again.
    restarted = make(backend)
    result = restarted.handle_batch("c1", messages, counter_handlers)
    assert all(r.applied for r in result.results)
    snap = restarted.get("c1")
    assert snap.state.applied == [f"m{i}" for i in range(5)]
    assert [e.seq for e in snap.outbox] == [1, 2, 3, 4, 5]


def test_an_ambiguous_write_is_settled_by_the_inbox() -> None:
    backend = Faulty()
    store = make(backend)
    store.create("c1", Counter())
    backend.fail_after_applying = 1
    result = store.handle_batch("c1", [add_msg(f"m{i}") for i in range(4)], counter_handlers)
    # The write happened; its reply was lost; the reload finds every ID in the inbox.
    assert [r.status for r in result.results] == [Status.DUPLICATE] * 4
    assert store.get("c1").state.applied == ["m0", "m1", "m2", "m3"]


def test_a_batch_larger_than_the_window_commits_window_sized_chunks() -> None:
    backend = Faulty()
    store = make(backend, inbox=InboxPolicy(window=4))
    store.create("c1", Counter())
    ids = [f"m{i}" for i in range(10)]
    # m0 again at the end: out of the stored window by then, still a duplicate.
    messages = [add_msg(i) for i in ids] + [add_msg("m0")]
    backend.fail_after_applying = 2  # every chunk's ID is still in the inbox on reload
    result = store.handle_batch("c1", messages, counter_handlers)
    assert [r.status for r in result.results][-1] is Status.DUPLICATE
    snap = store.get("c1")
    assert snap.state.applied == ids
    assert list(snap.inbox) == ids[-4:]


def test_a_batch_that_would_overflow_the_document_is_cut_into_commits() -> None:
    backend = Faulty(max_document_bytes=6_000)
    store = make(backend)
    store.create("c1", Counter())
    blob = "x" * 400
    messages = [
        Message(id=f"m{i}", type="Add", payload={"n": 1, "emits": 1, "blob": blob})
        for i in range(8)
    ]
    huge = Message(id="huge", type="Add", payload={"n": 1, "emits": 1, "blob": "y" * 7_000})
    result = store.handle_batch("c1", [*messages[:4], huge, *messages[4:]], counter_handlers)
    statuses = [r.status for r in result.results]
    assert statuses[4] == "failed"
    failed = result.results[4]
    assert isinstance(failed, Failed) and isinstance(failed.error, DocumentTooLarge)
    assert statuses[:4] == [Status.APPLIED] * 4
    # The outbox keeps growing (no dispatcher here): later messages are refused, not lost.
    sent = [*messages[:4], huge, *messages[4:]]
    applied = [m.id for m, r in zip(sent, result.results, strict=True) if r.applied]
    assert store.get("c1").state.applied == applied
    assert len(applied) >= 5 and result.commits >= 2
    assert all(isinstance(r, Failed) for r in result.results if not r.applied)
    assert backend.document_size(backend.load("c1")) <= 6_000


def test_exact_marks_in_a_batch() -> None:
    backend = Faulty()
    store = make(backend, inbox=InboxPolicy(window=0, exact=True))
    store.create("c1", Counter())
    messages = [add_msg(f"id-{s}", source="P/1", seq=s) for s in (3, 1, 2, 2, 5)]
    result = store.handle_batch("c1", messages, counter_handlers)
    assert [r.status for r in result.results] == [
        Status.APPLIED,
        Status.APPLIED,
        Status.APPLIED,
        Status.DUPLICATE,
        Status.APPLIED,
    ]
    doc = backend.load("c1")
    assert doc["inbox_marks"] == [{"source": "P/1", "hw": 3, "above": [5]}]
    assert result.writes == 1


def test_a_conflicting_writer_elsewhere_is_retried() -> None:
    backend = Faulty()
    store = make(backend)
    store.create("c1", Counter())
    backend.reject = 2
    result = store.handle_batch("c1", [add_msg("m1"), add_msg("m2")], counter_handlers)
    assert all(r.applied for r in result.results)
    assert result.writes == 3 and result.commits == 1


def test_missing_aggregate_without_create_fails_each_message() -> None:
    store = make(Faulty())
    result = store.handle_batch("nobody", [add_msg("m1")], counter_handlers)
    assert isinstance(result.results[0], Failed)
    assert store.load("nobody") is None


def test_async_batch_shares_the_flow() -> None:
    async def main() -> None:
        backend = AsyncMemoryBackend()
        store = AsyncAggregateStore(backend, Counter)
        result = await store.handle_batch(
            "c1", [add_msg(f"m{i}") for i in range(5)], counter_handlers, create=True
        )
        assert result.writes == 1 and all(r.applied for r in result.results)
        assert (await store.get("c1")).state.total == 5

    loopless.run(main())


def test_insert_plan_is_used_for_a_new_aggregate() -> None:
    class Recording(MemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.plans: list[WritePlan] = []

        def write(self, plan: WritePlan) -> bool:
            self.plans.append(plan)
            return super().write(plan)

    backend = Recording()
    make(backend).handle_batch("n", [add_msg("a"), add_msg("b")], counter_handlers, create=True)
    assert [type(p) for p in backend.plans] == [InsertPlan]


def test_a_second_copy_of_an_applied_message_is_never_reported_failed() -> None:
    """The call ends in failure after m1 was committed: its second copy in the batch is a
    duplicate, not a failure (a consumer would redeliver a failure, maybe once m1 has left
    the window, and apply it twice)."""

    class FailingLater(Faulty):
        def write(self, plan: WritePlan) -> bool:
            if isinstance(plan, CommitPlan) and "m5" in plan.inbox_push:
                raise TransientStoreError("write failed")
            return super().write(plan)

    backend = FailingLater()
    store = make(backend, inbox=InboxPolicy(window=4))
    store.create("c1", Counter())
    messages = [add_msg(f"m{i}") for i in range(1, 6)] + [add_msg("m1")]
    result = store.handle_batch("c1", messages, counter_handlers)
    statuses = [r.status for r in result.results]
    assert statuses == [Status.APPLIED] * 4 + ["failed", Status.DUPLICATE]
