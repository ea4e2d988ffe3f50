"""Scheduled and cancellable entries: the store's rules and the engine's, on memory ports.

The engine is stepped on a simulated clock (:class:`tests.unit.test_engine_stepped.Stepped`),
so "never before it is due" and "within the bound" are counted in steps.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox import Aggregate, AggregateStore, Decision, Handlers, Message, StoreConfig, emit
from docoutbox.dispatch.engine.due import due_order, unreleased
from docoutbox.dispatch.engine.flow import DispatchPolicy, Publish, dispatch_document
from docoutbox.dispatch.engine.loop import FindDue
from docoutbox.errors import InvalidHandlerResult, InvalidMessage
from docoutbox.handlers import Context
from docoutbox.model import cancel
from docoutbox.store.plans import ReleasePlan, SettlePlan, TrimPlan, apply_plan
from docoutbox.store.schedule import ceil_millis
from tests.unit.test_dispatch_stream import Regained
from tests.unit.test_engine_stepped import STEP, Stepped

BASE = datetime(2030, 1, 1, tzinfo=UTC)


class Timer(Aggregate):
    n: int = 0


handlers: Handlers[Timer] = Handlers()


@handlers.on("Start")
def _start(state: Timer, message: Message, context: Context) -> Decision[Timer]:
    body = message.payload
    key = body.get("key")
    assert key is None or isinstance(key, str)
    delay = body["after"]
    assert isinstance(delay, int | float)
    return Decision(
        state, emit("Timeout", {"key": key}, deliver_after=timedelta(seconds=delay), key=key)
    )


@handlers.on("Stop")
def _stop(state: Timer, message: Message, context: Context) -> Decision[Timer]:
    key = message.payload["key"]
    assert isinstance(key, str)
    return Decision(state.model_copy(update={"n": len(context.scheduled)}), cancel(key))


@handlers.on("Ping")
def _ping(state: Timer, message: Message) -> Decision[Timer]:
    return Decision(state, emit("Pong"))


def msg(message_id: str, kind: str, **payload: Any) -> Message:
    return Message(id=message_id, type=kind, payload=payload)


class World(Stepped):
    """A stepped engine, and a Timer store on the same clock."""

    def __init__(self) -> None:
        super().__init__()
        config = StoreConfig(clock=self.wall)
        self.timers = AggregateStore(self.backend, Timer, config)

    def wall(self) -> datetime:
        return BASE + timedelta(milliseconds=round(self.now * 1000))

    def handle(self, aggregate: str, message: Message) -> Any:
        outcome = self.timers.handle(aggregate, message, handlers, create=True)
        assert outcome.applied
        return outcome

    def start(self) -> Any:
        engine = super().start()
        engine.due_scans = self.ports.due
        return engine

    def published(self) -> list[str]:
        return [entry.type for entry in self.publisher.published]


# -- the emit and cancel API ---------------------------------------------------------


def test_bad_schedules_are_refused_with_typed_errors() -> None:
    with pytest.raises(InvalidMessage):
        emit("T", deliver_at=BASE, deliver_after=1)
    with pytest.raises(InvalidMessage):
        emit("T", deliver_at=datetime(2030, 1, 1))  # naive
    with pytest.raises(InvalidMessage):
        emit("T", deliver_after=-1)
    with pytest.raises(InvalidMessage):
        emit("T", deliver_after=float("nan"))
    with pytest.raises(InvalidMessage):
        emit("T", key="k")  # a key is for a scheduled emit only
    with pytest.raises(InvalidMessage):
        cancel("")


def test_due_is_stored_rounded_up_to_the_millisecond() -> None:
    at = datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert ceil_millis(at) == datetime(2030, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)
    assert ceil_millis(BASE) == BASE


def test_a_scheduled_entry_carries_due_and_key_and_the_document_its_hint() -> None:
    world = World()
    outcome = world.handle("t", msg("m1", "Start", after=10, key="k"))
    [entry] = outcome.entries
    assert entry["due"] == BASE + timedelta(seconds=10)
    assert entry["key"] == "k"
    assert world.backend.docs["t"]["earliest_due"] == BASE + timedelta(seconds=10)
    world.handle("p", msg("m2", "Ping"))
    plain = world.backend.docs["p"]
    assert "earliest_due" not in plain  # documents without schedules are unchanged
    assert "due" not in plain["outbox"][0]


def test_cancel_marks_the_entry_and_moves_the_hint() -> None:
    world = World()
    world.handle("t", msg("m1", "Start", after=10, key="a"))
    world.handle("t", msg("m2", "Start", after=20, key="b"))
    assert world.backend.docs["t"]["earliest_due"] == BASE + timedelta(seconds=10)
    outcome = world.handle("t", msg("m3", "Stop", key="a"))
    assert outcome.cancelled == ("a",)
    assert outcome.state.n == 2  # the context listed both keys
    doc = world.backend.docs["t"]
    assert doc["cancelled"] == [doc["outbox"][0]["id"]]
    assert doc["earliest_due"] == BASE + timedelta(seconds=20)
    again = world.handle("t", msg("m4", "Stop", key="a"))
    assert again.cancelled == ()  # cancelled already: a no-op the handler can see
    unknown = world.handle("t", msg("m5", "Stop", key="nope"))
    assert unknown.cancelled == ()
    world.handle("t", msg("m6", "Stop", key="b"))
    assert "earliest_due" not in world.backend.docs["t"]


def test_a_key_already_pending_is_refused_unless_cancelled_in_the_same_decision() -> None:
    world = World()
    world.handle("t", msg("m1", "Start", after=10, key="a"))
    with pytest.raises(InvalidHandlerResult, match="already pending"):
        world.timers.handle("t", msg("m2", "Start", after=5, key="a"), handlers)

    def restart(state: Timer, message: Message) -> Decision[Timer]:
        return Decision(state, cancel("a"), emit("Timeout", deliver_after=5, key="a"))

    outcome = world.timers.handle("t", msg("m3", "Restart"), restart)
    assert outcome.cancelled == ("a",)
    assert world.backend.docs["t"]["earliest_due"] == BASE + timedelta(seconds=5)


# -- the plans' reference semantics --------------------------------------------------


def scheduled_doc() -> dict[str, Any]:
    world = World()
    world.handle("t", msg("m1", "Start", after=10, key="a"))
    return world.backend.docs["t"]


def test_a_scheduled_entry_takes_no_seq_until_released() -> None:
    doc = scheduled_doc()
    assert "seq" not in doc["outbox"][0]
    assert doc["outbox_seq"] == 0


def test_a_release_numbers_the_entry_and_fails_once_cancelled_or_numbered_since() -> None:
    doc = scheduled_doc()
    entry_id = doc["outbox"][0]["id"]
    seq = doc["outbox_seq"]
    released = apply_plan(doc, ReleasePlan("t", entry_id, seq))
    assert released is not None and released["outbox"][0]["released"] is True
    assert released["outbox"][0]["seq"] == seq + 1 == released["outbox_seq"]
    # A business commit read before the release conflicts instead of reusing the number.
    assert released["version"] == doc["version"] + 1
    assert apply_plan(released, ReleasePlan("t", entry_id, seq + 1)) is None  # released
    assert apply_plan({**doc, "cancelled": [entry_id]}, ReleasePlan("t", entry_id, seq)) is None
    assert apply_plan(doc, ReleasePlan("t", entry_id, seq + 1)) is None  # outbox_seq moved
    assert apply_plan(doc, ReleasePlan("t", "gone", seq)) is None


def test_a_cancel_racing_a_release_is_retried_and_cancels_nothing() -> None:
    world = World()
    world.handle("t", msg("m1", "Start", after=10, key="a"))
    entry_id = world.backend.docs["t"]["outbox"][0]["id"]
    # The store's cached copy predates the release: its commit fails, it reloads, and
    # the handler then sees no cancellable key.
    assert world.backend.write(ReleasePlan("t", entry_id, 0))
    outcome = world.handle("t", msg("m2", "Stop", key="a"))
    assert outcome.cancelled == ()
    assert outcome.state.n == 0
    assert "cancelled" not in world.backend.docs["t"]


def test_a_trim_removes_cancelled_ids_and_a_settle_is_guarded_by_version() -> None:
    doc = {**scheduled_doc(), "cancelled": ["x"]}
    entry_id = doc["outbox"][0]["id"]
    trimmed = apply_plan({**doc, "cancelled": [entry_id]}, TrimPlan("t", (entry_id,)))
    assert trimmed is not None and trimmed["cancelled"] == [] and trimmed["outbox"] == []
    assert apply_plan(doc, SettlePlan("t", doc["version"] + 1, None)) is None
    settled = apply_plan(doc, SettlePlan("t", doc["version"], None))
    assert settled is not None and "earliest_due" not in settled


# -- which entries a run publishes ---------------------------------------------------


def entry(name: str, seq: int | None, due: int | None = None, **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"id": name, "created_at": BASE, **extra}
    if seq is not None:
        raw["seq"] = seq
    if due is not None:
        raw["due"] = BASE + timedelta(seconds=due)
    return raw


def test_numbered_entries_go_in_seq_order_then_due_ones_by_due_then_stored_order() -> None:
    doc = {
        "_id": "t",
        "outbox": [
            entry("s50", None, due=50),
            entry("s30a", None, due=30),
            entry("e2", 2),
            entry("r3", 3, due=10, released=True),  # released: numbered, in seq order
            entry("e1", 1),
            entry("s30b", None, due=30),
            entry("s99", None, due=99),  # not due: holds back nothing
            entry("e4", 4),
        ],
    }
    order = due_order(doc, BASE + timedelta(seconds=70))
    assert [e["id"] for e in order.entries] == ["e1", "e2", "r3", "e4", "s30a", "s30b", "s50"]
    assert order.next_due == BASE + timedelta(seconds=99)
    assert [e["id"] for e in due_order(doc, None).entries] == ["e1", "e2", "r3", "e4"]


@pytest.mark.parametrize(
    ("mark", "numbered"), [(True, True), (False, False), (1, False), ("yes", False), (None, False)]
)
def test_only_released_true_counts_as_numbered(mark: Any, numbered: bool) -> None:
    """A scheduled entry is released only by ``released: true``: any other mark leaves it
    unreleased (to the dispatcher's due path, where a malformed one is quarantined, and
    out of the immediate path)."""
    stored = entry("s", 1, due=10, released=mark)
    assert unreleased(stored) is not numbered
    order = due_order({"_id": "t", "outbox": [stored]}, None)
    assert [e["id"] for e in order.entries] == (["s"] if numbered else [])


def test_a_stale_copy_never_publishes_an_entry_cancelled_since() -> None:
    world = World()
    world.handle("t", msg("m1", "Start", after=1, key="a"))
    copy = world.backend.load("t")
    assert copy is not None
    world.handle("t", msg("m2", "Stop", key="a"))
    flow = dispatch_document(
        copy, DispatchPolicy(), random.Random(0), now=BASE + timedelta(hours=1)
    )
    ops: list[Any] = []
    reply: Any = None
    try:
        while True:
            op = flow.send(reply)
            ops.append(op)
            reply = world.backend.write(op.plan) if hasattr(op, "plan") else None
    except StopIteration as stop:
        result = stop.value
    assert not any(isinstance(op, Publish) for op in ops)
    # The release failed: the entry is left for a run on a fresh copy, which trims it.
    assert result.raced == [copy["outbox"][0]["id"]] and result.dropped == []
    assert result.next_due == copy["outbox"][0]["due"]  # the due query runs again at once
    fresh = world.backend.load("t")
    assert fresh is not None
    result = run_flow(world, fresh, BASE + timedelta(hours=1))
    assert result.dropped == [copy["outbox"][0]["id"]]
    doc = world.backend.docs["t"]
    assert doc["outbox"] == [] and doc["cancelled"] == []
    assert "earliest_due" not in doc


def run_flow(world: World, doc: dict[str, Any], now: datetime) -> Any:
    """One dispatch flow over ``doc``, its writes applied to the world's backend."""
    flow = dispatch_document(doc, DispatchPolicy(), random.Random(0), now=now)
    reply: Any = None
    try:
        while True:
            op = flow.send(reply)
            reply = world.backend.write(op.plan) if hasattr(op, "plan") else None
    except StopIteration as stop:
        return stop.value


# -- the engine ----------------------------------------------------------------------


def steps_for(seconds: float) -> int:
    return round(seconds / STEP)


def test_a_scheduled_entry_is_published_when_due_never_before_and_holds_nothing_back() -> None:
    world = World()
    world.start()
    world.handle("t", msg("m1", "Start", after=2, key="a"))
    world.handle("t", msg("m2", "Ping"))
    world.until(lambda: world.published() == ["Pong"])
    due = BASE + timedelta(seconds=2)
    while world.wall() < due:
        assert world.published() == ["Pong"], world.wall()
        world.step()
    steps = world.until(lambda: world.published() == ["Pong", "Timeout"])
    # Within the due query's interval (0.5 s) plus a turn, counted in steps.
    assert steps <= steps_for(world.config.due_interval) + 2
    world.until(lambda: world.pending() == 0)
    doc = world.backend.docs["t"]
    assert "earliest_due" not in doc  # settled once published


def test_a_cancelled_entry_is_never_published_and_is_trimmed() -> None:
    world = World()
    world.start()
    world.handle("t", msg("m1", "Start", after=1, key="a"))
    for _ in range(steps_for(0.5)):
        world.step()
    world.handle("t", msg("m2", "Stop", key="a"))
    for _ in range(steps_for(3)):
        world.step()
    assert world.published() == []
    doc = world.backend.docs["t"]
    assert doc["outbox"] == [] and doc["cancelled"] == []
    assert "earliest_due" not in doc


def test_the_due_query_finds_entries_the_stream_passed_before_they_were_due() -> None:
    world = World()
    world.start()
    world.handle("t", msg("m1", "Start", after=3, key="a"))
    world.until(lambda: world.checkpoints.load("t") == len(world.backend.changes))
    # A new engine (a restart, a takeover) starts from the checkpoint past that change.
    world.start()
    world.until(lambda: world.published() == ["Timeout"])
    assert world.wall() >= BASE + timedelta(seconds=3)


def test_without_a_due_query_the_engine_issues_none() -> None:
    world = World()
    engine = Stepped.start(world)  # due_scans left off, as for a store without find_due
    assert engine.due_scans is False
    world.handle("t", msg("m1", "Start", after=0.1, key="a"))
    for _ in range(steps_for(1)):
        world.step()
    assert world.published() == []  # left to the sweeps (sweep_interval: an hour here)


def test_a_batch_reports_its_cancels_and_never_stores_what_it_schedules_and_cancels() -> None:
    world = World()
    world.handle("t", msg("m0", "Start", after=10, key="old"))
    batch = world.timers.handle_batch(
        "t",
        [
            msg("m1", "Start", after=10, key="new"),
            msg("m2", "Stop", key="new"),
            msg("m3", "Stop", key="old"),
        ],
        handlers,
    )
    cancelled = [outcome.cancelled for outcome in batch.results]  # type: ignore[union-attr]
    assert cancelled == [(), ("new",), ("old",)]
    doc = world.backend.docs["t"]
    assert [e.get("key") for e in doc["outbox"]] == ["old"]  # "new" was never stored
    assert doc["cancelled"] == [doc["outbox"][0]["id"]]
    assert "earliest_due" not in doc


def test_the_due_query_clears_the_hint_a_run_died_before_settling() -> None:
    world = World()
    world.start()
    world.handle("t", msg("m1", "Start", after=1, key="a"))
    doc = world.backend.docs["t"]
    # Published and trimmed, then the run died: the hint stays, the outbox is empty.
    assert world.timers.trim("t", [doc["outbox"][0]["id"]])
    assert world.backend.docs["t"]["earliest_due"] is not None
    world.until(lambda: "earliest_due" not in world.backend.docs["t"])
    assert world.published() == []


def releases_of(world: World) -> list[Any]:
    """The aggregates of every release ``world`` performs from now on, in order."""
    releases: list[Any] = []
    perform = world.ports.perform

    def counting(op: Any) -> Any:
        if isinstance(getattr(op, "plan", None), ReleasePlan):
            releases.append(op.plan.aggregate_id)
        return perform(op)

    world.ports.perform = counting  # type: ignore[method-assign]
    return releases


@pytest.mark.parametrize(
    ("field", "corrupt"),
    [
        *(("outbox_seq", value) for value in ("3", 2.5, -1, None, True)),
        *(("cancelled", value) for value in ("x", {"a": 1}, 3)),
    ],
)
def test_a_corrupt_field_quarantines_the_due_entry_once_and_never_spins(
    field: str, corrupt: Any
) -> None:
    """A release numbers an entry from the document's ``outbox_seq`` and is refused when
    ``cancelled`` is not an array of entry IDs: on a document whose ``outbox_seq`` is not a
    sequence number, or whose ``cancelled`` is not an array, it can never apply, so the
    due entry is quarantined (dead letter with the reason) instead of being released
    again at every turn."""
    world = World()
    world.start()
    world.handle("t", msg("m1", "Start", after=1, key="a"))
    world.handle("u", msg("m2", "Start", after=1, key="a"))
    if corrupt is None:
        del world.backend.docs["t"][field]
    else:
        world.backend.docs["t"][field] = corrupt
    releases = releases_of(world)
    for _ in range(steps_for(4)):
        world.step()
    assert releases == ["u"]  # the good document's only; none tried on the corrupt one
    assert world.published() == ["Timeout"]
    [dead] = world.dead.entries.values()
    assert dead["aggregate_id"] == "t" and field in dead["error"]
    assert world.backend.docs["t"]["outbox"] == []
    assert "earliest_due" not in world.backend.docs["t"]


@pytest.mark.parametrize("mark", [1, "yes", None, 0])
@pytest.mark.parametrize("scheduled", [True, False])
def test_an_entry_whose_released_is_not_a_boolean_is_quarantined_unpublished(
    mark: Any, scheduled: bool
) -> None:
    """Only ``released: true`` is released, ``false`` or absent is not; any other value is
    malformed: the entry (scheduled and due, or immediate) is quarantined with the
    reason, never released nor published, and the aggregate's other entries go on."""
    world = World()
    world.start()
    if scheduled:
        world.handle("t", msg("m1", "Start", after=1, key="a"))
    else:
        world.handle("t", msg("m1", "Ping"))
    world.handle("t", msg("m2", "Ping"))
    world.backend.docs["t"]["outbox"][0]["released"] = mark
    releases = releases_of(world)
    for _ in range(steps_for(4)):
        world.step()
    assert releases == [] and world.published() == ["Pong"]
    [dead] = world.dead.entries.values()
    assert dead["aggregate_id"] == "t" and f"released {mark!r} is not a boolean" in dead["error"]
    assert world.backend.docs["t"]["outbox"] == []


def test_a_partition_acquired_is_queried_for_due_entries_at_the_next_turn() -> None:
    """A takeover's scheduled entries wait for no periodic query: the turn after an
    acquisition queries (part of the bound across a crash, docs/how-to/schedule.md)."""
    world = World()
    engine = world.start()
    ownership = Regained()
    engine.ownership = ownership
    queries: list[float] = []
    perform = world.ports.perform

    def counting(op: Any) -> Any:
        if isinstance(op, FindDue):
            queries.append(world.now)
        return perform(op)

    world.ports.perform = counting  # type: ignore[method-assign]
    world.until(lambda: bool(queries))  # the first turn queries at once
    for _ in range(steps_for(0.1)):
        world.step()
    assert len(queries) == 1  # the next periodic query is 0.5 s after the first
    ownership.acquired = [frozenset({0})]
    world.step()
    assert len(queries) == 2
