"""Inbox spill-over: IDs leave the document for the archive and stay recognised."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest

from docoutbox import (
    Aggregate,
    AggregateStore,
    AsyncAggregateStore,
    Decision,
    InboxPolicy,
    Message,
    StoreConfig,
)
from docoutbox.errors import (
    DocumentTooLarge,
    InboxSaturated,
    InvalidConfig,
    PermanentStoreError,
    TransientStoreError,
)
from docoutbox.model import AggregateId
from docoutbox.store.plans import CommitPlan, WritePlan
from docoutbox.store.spill import MAX_TOKEN, SPILL, plan_spill, spilled
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos.items import commit_patch
from docoutbox_mongo.plans import commit_update
from tests.support import loopless

SPILLING = InboxPolicy(window=4, spill=True)


class Recording(MemoryBackend):
    """A memory backend that records the order of its archive writes, reads and commits."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []
        self.fail_archive = False
        self.fail_commit = False

    def write(self, plan: WritePlan) -> bool:
        if isinstance(plan, CommitPlan):
            self.calls.append(f"commit:{','.join(plan.inbox_spilled)}")
            if self.fail_commit:
                raise TransientStoreError("injected: the commit failed")
        return super().write(plan)

    def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        self.calls.append(f"archive:{','.join(ids)}")
        if self.fail_archive:
            raise TransientStoreError("injected: the archive write failed")
        super().archive_inbox(aggregate_id, ids)
        return f"token-{len(self.calls)}"

    def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        self.calls.append(f"lookup:{','.join(ids)}:{token}")
        return super().archived_inbox(aggregate_id, ids, token)


def store(backend: MemoryBackend, policy: InboxPolicy = SPILLING) -> AggregateStore[Counter]:
    return AggregateStore(backend, Counter, StoreConfig(inbox=policy, cache_size=0))


def test_more_messages_than_the_window_holds_are_all_recognised() -> None:
    backend = MemoryBackend()
    counters = store(backend)
    for i in range(25):
        assert counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True).applied
    for i in range(25):
        assert counters.handle("c", add_msg(f"m{i}"), counter_handlers).duplicate, i
    doc = backend.docs["c"]
    assert doc["state"]["total"] == 25
    assert len(doc["inbox"]) <= 4
    kept = set(doc["inbox"]) | backend.archive["c"]
    assert kept == {f"m{i}" for i in range(25)}
    assert spilled(doc)[0] == len(backend.archive["c"])


def test_without_spill_a_message_past_the_window_is_handled_again() -> None:
    counters = store(MemoryBackend(), InboxPolicy(window=4))
    for i in range(6):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    assert counters.handle("c", add_msg("m0"), counter_handlers).applied
    assert SPILL not in counters.backend.load("c")  # type: ignore[operator]


def test_a_spill_takes_half_the_window_at_once() -> None:
    backend = Recording()
    counters = store(backend, InboxPolicy(window=10, spill=True))
    for i in range(31):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    archives = [c for c in backend.calls if c.startswith("archive")]
    # Full at 10 IDs: each new message past that keeps the newest 5, itself included,
    # so each spill moves 6 and the next comes 6 messages later.
    assert archives == [
        "archive:" + ",".join(f"m{i}" for i in range(start, start + 6)) for start in (0, 6, 12, 18)
    ]


def test_the_archive_is_written_before_the_commit_that_removes_the_ids() -> None:
    backend = Recording()
    counters = store(backend)
    for i in range(5):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    assert backend.calls[-2:] == ["archive:m0,m1,m2", "commit:m0,m1,m2"]
    assert backend.docs["c"][SPILL] == {"count": 3, "token": "token-4"}


def test_a_redelivery_is_looked_up_after_the_document_with_the_spill_token() -> None:
    backend = Recording()
    counters = store(backend)
    for i in range(5):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    backend.calls.clear()
    assert counters.handle("c", add_msg("m1"), counter_handlers).duplicate
    assert backend.calls == ["lookup:m1:token-4"]


def test_an_aggregate_that_never_spilled_reads_no_archive() -> None:
    backend = Recording()
    counters = store(backend)
    for i in range(4):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    counters.handle("c", add_msg("m0"), counter_handlers)
    assert not [c for c in backend.calls if c.startswith(("lookup", "archive"))]


def test_a_failed_archive_write_commits_nothing_and_forgets_nothing() -> None:
    backend = Recording()
    counters = store(backend)
    for i in range(4):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    backend.fail_archive = True
    with pytest.raises(TransientStoreError):
        counters.handle("c", add_msg("m4"), counter_handlers)
    assert not [c for c in backend.calls if c.startswith("commit:m0")]
    assert backend.docs["c"]["inbox"] == ["m0", "m1", "m2", "m3"]
    backend.fail_archive = False
    assert counters.handle("c", add_msg("m4"), counter_handlers).applied
    assert counters.handle("c", add_msg("m0"), counter_handlers).duplicate


def test_a_commit_lost_after_its_archive_write_leaves_the_ids_in_both() -> None:
    backend = Recording()
    counters = AggregateStore(
        backend, Counter, StoreConfig(inbox=SPILLING, cache_size=0), sleep=lambda _: None
    )
    for i in range(4):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    backend.fail_commit = True
    with pytest.raises(TransientStoreError):
        counters.handle("c", add_msg("m4"), counter_handlers)
    assert backend.docs["c"]["inbox"] == ["m0", "m1", "m2", "m3"]
    assert backend.archive["c"] == {"m0", "m1", "m2"}
    backend.fail_commit = False
    for i in range(4):
        assert counters.handle("c", add_msg(f"m{i}"), counter_handlers).duplicate


class Tally(Aggregate):
    n: int = 0


def count(state: Tally, message: Message) -> Decision[Tally]:
    return Decision(Tally(n=state.n + 1))


def test_a_document_near_its_size_limit_spills_instead_of_refusing() -> None:
    long_ids = [f"{i:04d}-" + "x" * 200 for i in range(40)]

    def tallies(backend: MemoryBackend, policy: InboxPolicy) -> AggregateStore[Tally]:
        return AggregateStore(backend, Tally, StoreConfig(inbox=policy))

    refusing = tallies(MemoryBackend(max_document_bytes=4000), InboxPolicy(window=1000))
    for message_id in long_ids[:18]:
        refusing.handle("c", add_msg(message_id), count, create=True)
    with pytest.raises(DocumentTooLarge):
        refusing.handle("c", add_msg(long_ids[18]), count)
    backend = MemoryBackend(max_document_bytes=4000)
    spilling = tallies(backend, InboxPolicy(window=1000, spill=True))
    for message_id in long_ids:
        assert spilling.handle("c", add_msg(message_id), count, create=True).applied
    assert backend.archive["c"]
    assert backend.document_size(backend.docs["c"]) <= 4000
    for message_id in long_ids:
        assert spilling.handle("c", add_msg(message_id), count).duplicate
    assert backend.docs["c"]["state"]["n"] == 40


def test_the_batch_path_looks_up_a_batch_at_once() -> None:
    backend = Recording()
    counters = store(backend)
    first = counters.handle_batch(
        "c", [add_msg(f"m{i}") for i in range(12)], counter_handlers, create=True
    )
    assert all(r.applied for r in first.results)
    backend.calls.clear()
    again = counters.handle_batch("c", [add_msg(f"m{i}") for i in range(13)], counter_handlers)
    assert [r.status for r in again.results] == ["duplicate"] * 12 + ["applied"]
    lookups = [c for c in backend.calls if c.startswith("lookup")]
    assert len(lookups) == 1 and lookups[0].startswith("lookup:m0,m1,")
    assert backend.docs["c"]["state"]["total"] == 13


def test_the_async_store_spills_and_recognises_alike() -> None:
    backend = AsyncMemoryBackend()
    counters = AsyncAggregateStore(backend, Counter, StoreConfig(inbox=SPILLING, cache_size=0))

    async def scenario() -> list[str]:
        for i in range(12):
            await counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
        return [
            (await counters.handle("c", add_msg(f"m{i}"), counter_handlers)).status
            for i in range(12)
        ]

    assert loopless.run(scenario()) == ["duplicate"] * 12
    assert backend.sync.archive["c"]


def test_exact_marks_never_spill_and_still_saturate() -> None:
    backend = Recording()
    policy = InboxPolicy(window=4, exact=True, max_above=2, spill=True)
    counters = store(backend, policy)
    for seq in (1, 3, 5):
        counters.handle(
            "c", add_msg(f"s{seq}", source="P/1", seq=seq), counter_handlers, create=True
        )
    with pytest.raises(InboxSaturated):
        counters.handle("c", add_msg("s7", source="P/1", seq=7), counter_handlers)
    assert not [c for c in backend.calls if c.startswith(("lookup", "archive"))]


def test_spill_needs_a_window_and_a_backend_with_an_archive() -> None:
    with pytest.raises(InvalidConfig, match="window"):
        InboxPolicy(window=0, spill=True)

    class NoArchive(MemoryBackend):
        archive_inbox = None  # type: ignore[assignment]

    class Plain:
        max_document_bytes = 1000

        def document_size(self, document: Any) -> int:
            return 0

        def load(self, aggregate_id: Any) -> Any:
            return None

        def write(self, plan: Any) -> bool:
            return True

        def find_pending(self, **kwargs: Any) -> list[Any]:
            return []

        def ensure_indexes(self) -> None:
            return None

    with pytest.raises(InvalidConfig, match="inbox archive"):
        store(Plain(), SPILLING)  # type: ignore[arg-type]
    store(Plain(), InboxPolicy(window=4))  # type: ignore[arg-type]


def test_plan_spill_keeps_the_plans_own_ids() -> None:
    plan = CommitPlan(
        aggregate_id="c",
        expected_version=3,
        state={},
        outbox_push=(),
        outbox_seq=0,
        inbox_push=("n1", "n2", "n3"),
        inbox_window=4,
        inbox_after=None,
        inbox_marks=None,
        updated_at=None,  # type: ignore[arg-type]
    )
    doc = {"_id": "c", "inbox": ["a", "b", "c"], SPILL: {"count": 7, "token": None}}
    spilt = plan_spill(plan, doc, SPILLING)
    assert spilt.inbox_spilled == ("a", "b", "c")
    assert spilt.inbox_after == ("n1", "n2", "n3")
    assert spilt.inbox_spill == {"count": 10, "token": None}
    assert plan_spill(plan, doc, InboxPolicy(window=4)) is plan
    assert plan_spill(plan, {"_id": "c", "inbox": ["a"]}, SPILLING) is plan
    everything = plan_spill(plan, {"_id": "c", "inbox": ["a"]}, SPILLING, everything=True)
    assert everything.inbox_spilled == ("a",)


def test_a_message_of_a_batch_stays_in_the_window_it_was_committed_to() -> None:
    backend = MemoryBackend()
    counters = store(backend)
    counters.handle_batch("c", [add_msg(f"m{i}") for i in range(3)], counter_handlers, create=True)
    counters.handle_batch("c", [add_msg(f"n{i}") for i in range(4)], counter_handlers)
    assert backend.docs["c"]["inbox"] == ["n0", "n1", "n2", "n3"]
    assert backend.archive["c"] == {"m0", "m1", "m2"}


def test_database_plans_set_the_spilled_inbox_instead_of_appending() -> None:
    backend = MemoryBackend()
    counters = store(backend)
    plans: list[CommitPlan] = []
    write = backend.write

    def recording(plan: WritePlan) -> bool:
        if isinstance(plan, CommitPlan):
            plans.append(plan)
        return write(plan)

    backend.write = recording  # type: ignore[method-assign]
    for i in range(5):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    spill = plans[-1]
    _, update = commit_update(spill)
    assert update["$set"]["inbox"] == ["m3", "m4"]
    assert update["$set"][SPILL] == {"count": 3, "token": None}
    assert "inbox" not in update.get("$push", {})
    _, plain = commit_update(plans[-2])
    assert plain["$push"]["inbox"] == {"$each": ["m3"], "$slice": -4}
    patch = commit_patch(spill)
    assert patch is not None
    ops = {op["path"]: op["value"] for op in patch[0] if op["op"] == "set"}
    assert ops["/inbox"] == ["m3", "m4"] and ops["/inbox_spill"]["count"] == 3


def test_a_batch_recognises_a_stored_id_its_own_messages_push_out_of_the_window() -> None:
    backend = MemoryBackend()
    counters = store(backend, InboxPolicy(window=2, spill=True))
    counters.handle_batch("c", [add_msg("m0"), add_msg("m1")], counter_handlers, create=True)
    again = counters.handle_batch("c", [add_msg("n0"), add_msg("m0")], counter_handlers)
    assert [r.status for r in again.results] == ["applied", "duplicate"]
    assert backend.docs["c"]["state"]["applied"] == ["m0", "m1", "n0"]


def test_a_failed_archive_read_is_retried_like_a_failed_load() -> None:
    class Flaky(Recording):
        failures = 2

        def archived_inbox(
            self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
        ) -> set[str]:
            if self.failures:
                self.failures -= 1
                raise TransientStoreError("injected: the archive read failed")
            return super().archived_inbox(aggregate_id, ids, token)

    backend = Flaky()
    counters = AggregateStore(
        backend, Counter, StoreConfig(inbox=SPILLING, cache_size=0), sleep=lambda _: None
    )
    for i in range(5):
        counters.handle("c", add_msg(f"m{i}"), counter_handlers, create=True)
    outcome = counters.handle("c", add_msg("m0"), counter_handlers)
    assert outcome.duplicate and backend.failures == 0
    backend.failures = 2
    batch = counters.handle_batch("c", [add_msg("m1"), add_msg("n1")], counter_handlers)
    assert [r.status for r in batch.results] == ["duplicate", "applied"]
    assert backend.failures == 0
    backend.failures = 100
    with pytest.raises(TransientStoreError):
        counters.handle("c", add_msg("m1"), counter_handlers)
    failed = counters.handle_batch("c", [add_msg("m2")], counter_handlers).results[0]
    assert isinstance(failed.error, TransientStoreError)  # type: ignore[union-attr]
    assert backend.docs["c"]["state"]["total"] == 6


def test_a_spills_token_never_lets_the_cached_size_fall_below_the_true_size() -> None:
    """The archive's token is set after the commit is measured: the size the store keeps
    for its cached copy must still bound the stored document, or a later commit could
    write a document over the limit."""

    class LongTokens(MemoryBackend):
        def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
            super().archive_inbox(aggregate_id, ids)
            return "t" * 300

    oversized = []
    for batch in (1, 3):
        for limit in range(400, 1300):
            backend = LongTokens(max_document_bytes=limit)
            tallies = AggregateStore(backend, Tally, StoreConfig(inbox=SPILLING))
            for i in range(0, 12, batch):
                messages = [add_msg(f"m{j}") for j in range(i, i + batch)]
                try:
                    if batch == 1:
                        tallies.handle("c", messages[0], count, create=True)
                    elif tallies.handle_batch("c", messages, count, create=True).failed:
                        break
                except DocumentTooLarge:
                    break
                if backend.document_size(backend.docs["c"]) > limit:
                    oversized.append((batch, limit))
                    break
    assert oversized == []


def test_an_archive_token_too_long_for_its_room_is_refused() -> None:
    class Huge(MemoryBackend):
        def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
            super().archive_inbox(aggregate_id, ids)
            return "t" * (MAX_TOKEN + 1)

    backend = Huge()
    tallies = AggregateStore(backend, Tally, StoreConfig(inbox=SPILLING), sleep=lambda _: None)
    for i in range(4):
        tallies.handle("c", add_msg(f"m{i}"), count, create=True)
    with pytest.raises(PermanentStoreError, match="token"):
        tallies.handle("c", add_msg("m4"), count)
    assert backend.docs["c"]["inbox"] == ["m0", "m1", "m2", "m3"]


def test_a_batch_near_the_size_limit_spills_instead_of_refusing() -> None:
    long_ids = [f"{i:04d}-" + "x" * 200 for i in range(42)]
    backend = MemoryBackend(max_document_bytes=4000)
    tallies = AggregateStore(
        backend, Tally, StoreConfig(inbox=InboxPolicy(window=1000, spill=True))
    )
    for start in range(0, 42, 3):
        batch = [add_msg(i) for i in long_ids[start : start + 3]]
        outcome = tallies.handle_batch("c", batch, count, create=True)
        assert all(r.applied for r in outcome.results), outcome.failed
    assert backend.document_size(backend.docs["c"]) <= 4000
    again = tallies.handle_batch("c", [add_msg(i) for i in long_ids], count)
    assert all(r.duplicate for r in again.results)
    assert backend.docs["c"]["state"]["n"] == 42
