"""The store contract: every backend, sync or async, must pass these tests.

Reuse it for your own backend by subclassing and providing a ``make_store`` fixture that
returns a factory ``make_store(model, config=None)``. Every store the factory returns
within one test must share one fresh, empty collection (they play separate processes).
Async stores can be wrapped in :class:`docoutbox.testing.blocking.BlockingStore`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from pydantic import Field

from docoutbox.errors import (
    DocumentTooLarge,
    InvalidAggregateId,
    InvalidMessage,
    NotFound,
    UnknownMessageType,
)
from docoutbox.handlers import Decision, Handlers
from docoutbox.model import Aggregate, InboxPolicy, Message, emit
from docoutbox.store.core import StoreConfig
from docoutbox.store.document import utcnow
from docoutbox.store.plans import (
    CommitPlan,
    InsertPlan,
    ReleasePlan,
    SettlePlan,
    TrimPlan,
    entry_id,
)
from docoutbox.testing.blocking import BlockingStore

MakeStore = Callable[..., Any]


class Counter(Aggregate):
    total: int = 0
    applied: list[str] = Field(default_factory=list)


counter_handlers: Handlers[Counter] = Handlers()


@counter_handlers.on("Add")
def add(state: Counter, message: Message) -> Decision[Counter]:
    amount = message.payload.get("n", 1)
    assert isinstance(amount, int)
    emits = int(message.payload.get("emits", 1) or 0)  # type: ignore[arg-type]
    new = state.model_copy(
        update={"total": state.total + amount, "applied": [*state.applied, message.id]}
    )
    blob = message.payload.get("blob", "")
    return Decision(new, [emit("Added", {"n": amount, "blob": blob}) for _ in range(emits)])


def add_msg(message_id: str, n: int = 1, emits: int = 1, **extra: Any) -> Message:
    return Message(id=message_id, type="Add", payload={"n": n, "emits": emits}, **extra)


def backend_of(store: Any) -> Any:
    """The store's backend, called synchronously (an async one on the loop of the
    :class:`~docoutbox.testing.blocking.BlockingStore` that wraps its store)."""
    if isinstance(store, BlockingStore):
        return store.blocking(store.backend)
    return store.backend


def raw_document(aggregate_id: str, outbox_seq: Any = 1, version: Any = 1) -> dict[str, Any]:
    """A stored document with one unnumbered entry to release, ``outbox_seq`` and
    ``version`` as given."""
    entry = {"id": f"{aggregate_id}-e", "type": "Added", "payload": {}, "headers": {}}
    return {
        "_id": aggregate_id,
        "type": "Counter",
        "version": version,
        "partition": 0,
        "state": {},
        "inbox": [],
        "outbox": [entry],
        "outbox_seq": outbox_seq,
        "updated_at": utcnow(),
    }


def bare_commit(aggregate_id: str, expected_version: int) -> CommitPlan:
    """A commit of an empty state that adds nothing, guarded by ``expected_version``."""
    return CommitPlan(aggregate_id, expected_version, {}, (), 1, (), 10, None, None, utcnow())


class StoreContract:
    """Behaviour every store backend must show."""

    @pytest.fixture
    def store(self, make_store: MakeStore) -> Any:
        return make_store(Counter)

    def test_create_is_idempotent(self, store: Any) -> None:
        first = store.create("c1", Counter(total=5))
        second = store.create("c1", Counter(total=99))
        assert first.created and not second.created
        assert second.snapshot.state.total == 5
        assert second.snapshot.version == 0

    def test_handle_commits_state_inbox_and_outbox_together(self, store: Any) -> None:
        store.create("c1", Counter())
        outcome = store.handle("c1", add_msg("m1", n=3, emits=2), counter_handlers)
        assert outcome.applied and outcome.version == 1
        snap = store.get("c1")
        assert snap.version == 1 and snap.state.total == 3
        assert "m1" in snap.inbox
        assert [e.seq for e in snap.outbox] == [1, 2]
        assert [e.id for e in snap.outbox] == [e.id for e in outcome.emitted]
        entry = snap.outbox[0]
        assert (entry.causation_id, entry.correlation_id) == ("m1", "m1")
        assert (entry.aggregate_id, entry.aggregate_type) == ("c1", "Counter")

    def test_redelivery_is_a_reported_no_op(self, store: Any) -> None:
        store.create("c1", Counter())
        store.handle("c1", add_msg("m1"), counter_handlers)
        before = store.get("c1")
        again = store.handle("c1", add_msg("m1"), counter_handlers)
        assert again.duplicate and not again.applied
        after = store.get("c1")
        assert (after.version, after.state, after.raw_outbox) == (
            before.version,
            before.state,
            before.raw_outbox,
        )

    def test_missing_aggregate(self, store: Any) -> None:
        with pytest.raises(NotFound):
            store.handle("nobody", add_msg("m1"), counter_handlers)
        assert store.load("nobody") is None
        created = store.handle("nobody", add_msg("m1"), counter_handlers, create=True)
        assert created.applied and created.version == 1
        assert store.get("nobody").state.total == 1

    def test_seq_is_gap_free_across_commits(self, store: Any) -> None:
        store.create("c1", Counter())
        for i, emits in enumerate([2, 0, 3, 1]):
            store.handle("c1", add_msg(f"m{i}", emits=emits), counter_handlers)
        snap = store.get("c1")
        assert snap.outbox_seq == 6
        assert [e.seq for e in snap.outbox] == [1, 2, 3, 4, 5, 6]

    def test_trim_removes_only_named_entries_and_keeps_version(self, store: Any) -> None:
        store.create("c1", Counter())
        store.handle("c1", add_msg("m1", emits=3), counter_handlers)
        ids = [e.id for e in store.get("c1").outbox]
        assert store.trim("c1", [ids[0], ids[2], "not-an-entry"])
        snap = store.get("c1")
        assert [e.id for e in snap.outbox] == [ids[1]]
        assert snap.version == 1
        assert not store.trim("missing", ["x"])

    def test_publish_failures_are_recorded_on_the_entry(self, store: Any) -> None:
        store.create("c1", Counter())
        first, second = store.handle("c1", add_msg("m1", emits=2), counter_handlers).emitted
        assert store.record_failure("c1", first.id, 2, "PublishError: nack")
        assert not store.record_failure("c1", "not-pending", 1, "x")
        assert not store.record_failure("missing", first.id, 1, "x")
        snap = store.get("c1")
        assert snap.version == 1
        assert (snap.outbox[0].attempts, snap.outbox[0].last_error) == (2, "PublishError: nack")
        assert (snap.outbox[1].attempts, snap.outbox[1].last_error) == (0, None)
        assert snap.outbox[1].id == second.id

    def test_stale_writer_reloads_instead_of_overwriting(self, make_store: MakeStore) -> None:
        a, b = make_store(Counter), make_store(Counter)
        a.create("c1", Counter())
        a.handle("c1", add_msg("m1", n=1), counter_handlers)  # a now holds version 1
        b.handle("c1", add_msg("m2", n=10), counter_handlers)  # b moves it to version 2
        outcome = a.handle("c1", add_msg("m3", n=100), counter_handlers)
        assert outcome.applied and outcome.version == 3
        snap = a.get("c1")
        assert snap.state.total == 111
        assert snap.state.applied == ["m1", "m2", "m3"]
        assert [e.seq for e in snap.outbox] == [1, 2, 3]

    def test_trim_never_makes_a_commit_fail(self, make_store: MakeStore) -> None:
        writer, dispatcher = make_store(Counter), make_store(Counter)
        writer.create("c1", Counter())
        first = writer.handle("c1", add_msg("m1"), counter_handlers)
        assert dispatcher.trim("c1", [e.id for e in first.emitted])
        second = writer.handle("c1", add_msg("m2"), counter_handlers)
        assert second.applied and second.attempts == 1
        snap = writer.get("c1")
        assert [e.seq for e in snap.outbox] == [2]  # the trimmed entry did not come back

    def test_commit_keeps_entries_it_did_not_publish(self, make_store: MakeStore) -> None:
        a, b = make_store(Counter), make_store(Counter)
        a.create("c1", Counter())
        a.handle("c1", add_msg("m1"), counter_handlers)
        b.handle("c1", add_msg("m2"), counter_handlers)
        a.handle("c1", add_msg("m3"), counter_handlers)
        assert [e.seq for e in a.get("c1").outbox] == [1, 2, 3]

    def test_inbox_window_is_bounded(self, make_store: MakeStore) -> None:
        store = make_store(Counter, StoreConfig(inbox=InboxPolicy(window=3)))
        store.create("c1", Counter())
        for i in range(5):
            store.handle("c1", add_msg(f"m{i}"), counter_handlers)
        assert store.get("c1").inbox == ("m2", "m3", "m4")
        assert store.handle("c1", add_msg("m4"), counter_handlers).duplicate

    def test_exact_mode_dedups_shuffled_stream_with_bounded_state(
        self, make_store: MakeStore
    ) -> None:
        store = make_store(Counter, StoreConfig(inbox=InboxPolicy(window=0, exact=True)))
        store.create("c1", Counter())
        rng = random.Random(7)
        seqs = list(range(1, 61)) + rng.sample(range(1, 61), 30)
        rng.shuffle(seqs)
        outcomes = [
            store.handle("c1", add_msg(f"id-{s}-{i}", n=s, source="P/p1", seq=s), counter_handlers)
            for i, s in enumerate(seqs)
        ]
        assert sum(o.applied for o in outcomes) == 60
        snap = store.get("c1")
        assert snap.state.total == sum(range(1, 61))
        assert snap.inbox == ()
        mark = snap.marks["P/p1"]
        assert (mark.hw, mark.above) == (60, ())

    def test_document_too_large_writes_nothing(self, store: Any) -> None:
        store.create("c1", Counter())
        big = Message(id="big", type="Add", payload={"n": 1, "blob": "x" * (17 * 1024 * 1024)})
        with pytest.raises(DocumentTooLarge) as caught:
            store.handle("c1", big, counter_handlers)
        error = caught.value
        assert error.aggregate_id == "c1"
        assert error.size is not None and error.limit is not None and error.size > error.limit
        snap = store.get("c1")
        assert snap.version == 0 and snap.raw_outbox == ()

    def test_pending_streams_pages_with_filters(self, store: Any) -> None:
        for i in range(5):
            store.create(f"c{i}", Counter())
            if i != 2:
                store.handle(f"c{i}", add_msg(f"m{i}"), counter_handlers)
        found = [s.aggregate_id for s in store.pending(batch_size=2)]
        assert found == ["c0", "c1", "c3", "c4"]
        assert list(store.pending(older_than=utcnow() - timedelta(hours=1))) == []
        later = utcnow() + timedelta(seconds=1)
        assert len(list(store.pending(older_than=later))) == 4
        partition = store.get("c3").partition
        ids = {s.aggregate_id for s in store.pending(partitions={partition})}
        assert "c3" in ids and all(store.get(i).partition == partition for i in ids)

    def test_a_scheduled_entry_is_pending_from_its_due_time(self, store: Any) -> None:
        def schedule(state: Counter, message: Message) -> Decision[Counter]:
            return Decision(state, emit("Later", deliver_after=timedelta(hours=1)))

        store.handle("s", Message(id="m1", type="Later"), schedule, create=True)
        soon = utcnow() + timedelta(seconds=1)
        assert [s.aggregate_id for s in store.pending()] == ["s"]
        assert list(store.pending(older_than=soon)) == []  # not due: not aged either
        late = utcnow() + timedelta(hours=2)
        assert [s.aggregate_id for s in store.pending(older_than=late)] == ["s"]

    def test_integer_ids_page_before_strings(self, store: Any) -> None:
        for aggregate_id in [3, 1, "b", 2, "a"]:
            store.handle(aggregate_id, add_msg("m"), counter_handlers, create=True)
        assert [s.aggregate_id for s in store.pending(batch_size=2)] == [1, 2, 3, "a", "b"]

    @pytest.mark.parametrize("bad", [{"$ne": None}, ["c1"], None, True, "", 1.5])
    def test_operator_ids_never_reach_a_filter(self, store: Any, bad: Any) -> None:
        store.create("c1", Counter())
        with pytest.raises(InvalidAggregateId):
            store.handle(bad, add_msg("m1"), counter_handlers)
        with pytest.raises(InvalidAggregateId):
            store.trim(bad, ["x"])
        with pytest.raises(InvalidAggregateId):
            store.load(bad)
        assert store.get("c1").version == 0

    def test_rejected_input_writes_nothing(self, store: Any) -> None:
        store.create("c1", Counter())
        with pytest.raises(InvalidMessage):
            store.handle("c1", {"type": "Add"}, counter_handlers)
        with pytest.raises(UnknownMessageType):
            store.handle("c1", Message(id="m1", type="Nope"), counter_handlers)

        def explode(state: Counter, message: Message) -> Counter:
            raise RuntimeError("business rule")

        with pytest.raises(RuntimeError):
            store.handle("c1", add_msg("m2"), explode)
        snap = store.get("c1")
        assert snap.version == 0 and snap.inbox == ()

    def test_deterministic_ids(self, make_store: MakeStore) -> None:
        store = make_store(Counter, StoreConfig(deterministic_ids=True))
        store.create("c1", Counter())
        outcome = store.handle("c1", add_msg("m1", emits=2), counter_handlers)
        assert [e.id for e in outcome.emitted] == [
            entry_id("Counter", "c1", 1),
            entry_id("Counter", "c1", 2),
        ]

    def test_a_release_compares_outbox_seq_as_a_number(self, store: Any) -> None:
        """A :class:`~docoutbox.store.plans.ReleasePlan` applies only while the stored
        ``outbox_seq`` equals the plan's, compared as the databases compare numbers: a
        stored 1.0 is 1, a stored ``true`` is not (:func:`~docoutbox.store.plans.apply_plan`)."""
        backend = backend_of(store)
        for aggregate_id, stored in (("int", 1), ("float", 1.0), ("bool", True), ("str", "1")):
            assert backend.write(InsertPlan(aggregate_id, raw_document(aggregate_id, stored)))
        assert not backend.write(ReleasePlan("int", "int-e", 0))  # stale
        assert backend.write(ReleasePlan("int", "int-e", 1))
        assert backend.write(ReleasePlan("float", "float-e", 1))
        for aggregate_id in ("bool", "str"):
            assert not backend.write(ReleasePlan(aggregate_id, f"{aggregate_id}-e", 1))
        for aggregate_id, seq in (("int", 2), ("float", 2)):
            doc = backend.load(aggregate_id)
            assert (doc["outbox_seq"], doc["outbox"][0]["seq"], doc["version"]) == (seq, seq, 2)
        for aggregate_id, stored in (("bool", True), ("str", "1")):
            doc = backend.load(aggregate_id)
            assert type(doc["outbox_seq"]) is type(stored) and doc["outbox_seq"] == stored
            assert "seq" not in doc["outbox"][0] and doc["version"] == 1

    def test_a_release_refuses_a_released_or_cancelled_entry(self, store: Any) -> None:
        """A :class:`~docoutbox.store.plans.ReleasePlan` never renumbers an entry already
        released, even while ``outbox_seq`` still matches, and never releases an entry
        that ``cancelled`` may name: one the array names, or any entry of a document whose
        ``cancelled`` is not an array (malformed: a string naming the entry, say)."""
        backend = backend_of(store)
        cancelled: dict[str, Any] = {
            "named": ["named-e"],
            "text": "text-e",
            "inside": "[inside-e]",
            "junk": "junk",
            "empty": [],
            "other": ["other-x"],
        }
        released = raw_document("released")
        released["outbox"][0].update(seq=1, released=True)
        assert backend.write(InsertPlan("released", released))
        for aggregate_id, value in cancelled.items():
            document = {**raw_document(aggregate_id), "cancelled": value}
            assert backend.write(InsertPlan(aggregate_id, document))
        for aggregate_id in ("released", "named", "text", "inside", "junk"):
            assert not backend.write(ReleasePlan(aggregate_id, f"{aggregate_id}-e", 1))
            doc = backend.load(aggregate_id)
            assert (doc["outbox_seq"], doc["version"]) == (1, 1)
            assert doc["outbox"][0].get("seq") == (1 if aggregate_id == "released" else None)
        for aggregate_id in ("empty", "other"):
            assert backend.write(ReleasePlan(aggregate_id, f"{aggregate_id}-e", 1))
            doc = backend.load(aggregate_id)
            assert (doc["outbox_seq"], doc["outbox"][0]["seq"], doc["version"]) == (2, 2, 2)
            assert doc["cancelled"] == cancelled[aggregate_id]

    def test_only_a_released_true_is_released(self, store: Any) -> None:
        """An entry is released only when its ``released`` is exactly ``true``; absent or
        ``false``, a release numbers it and a commit may cancel it; any other value
        (``1``, ``"yes"``, null) is malformed: neither released nor cancelled, the
        document left as it is (:func:`~docoutbox.store.schedule.release_open`)."""
        backend = backend_of(store)
        marks: dict[str, Any] = {
            "true": True,
            "false": False,
            "one": 1,
            "yes": "yes",
            "null": None,
            "missing": ...,
        }
        open_ = {"false", "missing"}
        for action in ("release", "cancel"):
            for name, value in marks.items():
                aggregate_id = f"{action}-{name}"
                document = raw_document(aggregate_id)
                if value is not ...:
                    document["outbox"][0]["released"] = value
                assert backend.write(InsertPlan(aggregate_id, document))
        for name, value in marks.items():
            release = ReleasePlan(f"release-{name}", f"release-{name}-e", 1)
            assert backend.write(release) is (name in open_), name
            cancel = replace(bare_commit(f"cancel-{name}", 1), cancel_ids=(f"cancel-{name}-e",))
            assert backend.write(cancel) is (name in open_), name
            released, cancelled = backend.load(release.aggregate_id), backend.load(f"cancel-{name}")
            if name in open_:
                assert released["outbox"][0]["released"] is True
                assert (released["outbox"][0]["seq"], released["version"]) == (2, 2)
                assert cancelled["cancelled"] == [f"cancel-{name}-e"]
                continue
            for doc in (released, cancelled):
                assert doc["version"] == 1 and "seq" not in doc["outbox"][0]
                assert not doc.get("cancelled")
                kept = doc["outbox"][0]["released"]
                assert type(kept) is type(value) and kept == value, name

    def test_a_trim_removes_entries_whatever_cancelled_holds(self, store: Any) -> None:
        """A :class:`~docoutbox.store.plans.TrimPlan` removes its entries from the outbox
        whatever the document's ``cancelled`` holds, alone or several in one round trip
        (``write_many``). It leaves a ``cancelled`` that is not an array (malformed, or
        null) as it is; an array keeps the IDs not trimmed (a store may leave the trimmed
        ones: the next commit drops them)."""
        backend = backend_of(store)
        batch = getattr(backend, "write_many", None)
        cancelled: dict[str, Any] = {
            "text": "a-e",
            "number": 3,
            "object": {"id": "a-e"},
            "null": None,
            "array": ["a-e", "kept"],
            "absent": ...,
        }
        for round_ in ("one", "many"):
            for name, value in cancelled.items():
                aggregate_id = f"{round_}-{name}"
                document = raw_document(aggregate_id)
                document["outbox"].append({**document["outbox"][0], "id": "a-e"})
                if value is not ...:
                    document["cancelled"] = value
                assert backend.write(InsertPlan(aggregate_id, document))
        for name in cancelled:
            assert backend.write(TrimPlan(f"one-{name}", ("a-e",)))
        plans = [TrimPlan(f"many-{name}", ("a-e",)) for name in cancelled]
        assert (batch(plans) if batch else [backend.write(p) for p in plans]) == [True] * 6
        for round_ in ("one", "many"):
            for name, value in cancelled.items():
                doc = backend.load(f"{round_}-{name}")
                assert [e["id"] for e in doc["outbox"]] == [f"{round_}-{name}-e"]
                if name == "array":
                    assert doc["cancelled"] in (["kept"], ["a-e", "kept"])
                elif value is ...:
                    assert doc.get("cancelled") in (None, [])
                else:
                    assert doc["cancelled"] == value

    def test_commits_and_settles_compare_version_as_a_number(self, store: Any) -> None:
        """A commit and a settle apply only while the stored ``version`` equals the plan's,
        compared as the databases compare numbers: a stored ``true`` is not 1."""
        backend = backend_of(store)
        for aggregate_id, stored in (("int", 1), ("bool", True), ("str", "1")):
            document = raw_document(aggregate_id, version=stored)
            assert backend.write(InsertPlan(aggregate_id, document))
        assert backend.write(SettlePlan("int", 1, None))
        assert backend.write(bare_commit("int", 1))
        assert backend.load("int")["version"] == 2
        for aggregate_id, stored in (("bool", True), ("str", "1")):
            assert not backend.write(SettlePlan(aggregate_id, 1, None))
            assert not backend.write(bare_commit(aggregate_id, 1))
            doc = backend.load(aggregate_id)
            assert type(doc["version"]) is type(stored) and doc["version"] == stored
