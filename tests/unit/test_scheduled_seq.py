"""Scheduled entries take their ``seq`` when released, so receivers' exact de-duplication
keeps compacting: a cancelled entry leaves no gap, one not yet due holds no number back,
and a release never shares a number with a concurrent commit's entry.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from docoutbox import (
    Aggregate,
    AggregateStore,
    Decision,
    Handlers,
    InboxPolicy,
    Message,
    StoreConfig,
    emit,
)
from docoutbox.dispatch.extras.immediate import _immediate
from docoutbox.store.plans import ReleasePlan, plan_commit
from docoutbox.testing import MemoryBackend
from tests.unit.test_scheduled import BASE, Timer, World, handlers, msg, run_flow


class Sink(Aggregate):
    seen: int = 0


sinks: Handlers[Sink] = Handlers()


@sinks.on("Pong")
@sinks.on("Timeout")
def _seen(state: Sink, message: Message) -> Decision[Sink]:
    return Decision(state.model_copy(update={"seen": state.seen + 1}))


def receive(world: World) -> tuple[int, tuple[int, ...]]:
    """Hand every published entry to a receiver in exact mode: its mark of the source."""
    config = StoreConfig(inbox=InboxPolicy(window=0, exact=True))
    receiver = AggregateStore(MemoryBackend(), Sink, config)
    for entry in world.publisher.published:
        assert receiver.handle("r", entry.to_message(), sinks, create=True).applied
    [mark] = receiver.get("r").marks.values()
    return mark.hw, mark.above


def pings(world: World, count: int) -> None:
    for i in range(count):
        world.handle("t", msg(f"p{i}", "Ping"))


def test_a_cancelled_entry_leaves_no_gap_for_exact_receivers() -> None:
    world = World()
    world.start()
    world.handle("t", msg("s", "Start", after=60, key="a"))
    world.handle("t", msg("c", "Stop", key="a"))
    pings(world, 5)
    world.until(lambda: world.pending() == 0)
    assert world.published() == ["Pong"] * 5
    assert receive(world) == (5, ())
    assert world.backend.docs["t"]["outbox_seq"] == 5


def test_an_entry_not_yet_due_holds_no_number_back() -> None:
    world = World()
    world.start()
    world.handle("t", msg("s", "Start", after=2, key="a"))
    pings(world, 5)
    world.until(lambda: world.published() == ["Pong"] * 5)
    assert receive(world) == (5, ())  # compacted while the timeout waits
    world.until(lambda: world.published() == ["Pong"] * 5 + ["Timeout"])
    assert [entry.seq for entry in world.publisher.published] == [1, 2, 3, 4, 5, 6]
    assert receive(world) == (6, ())


def check_release_and_commit_never_share_a_seq(backend: Any) -> None:
    """A release and a business commit computed from the same ``outbox_seq``: whichever
    writes second fails, so no two entries of the aggregate ever get one number."""
    store = AggregateStore(backend, Timer)
    store.handle("r", msg("s", "Start", after=60, key="k"), handlers, create=True)
    store.handle("r", msg("p0", "Ping"), handlers)
    before = store.get("r")
    [scheduled] = [e for e in before.raw_outbox if "due" in e]
    assert "seq" not in scheduled and before.outbox_seq == 1
    ping = msg("p1", "Ping")
    commit, _ = plan_commit(
        before,
        ping,
        Decision(before.state, emit("Pong")),
        policy=InboxPolicy(),
        now=before.updated_at or BASE,
        deterministic_ids=False,
    )
    # The release lands first: the commit read before it conflicts (version moved).
    assert backend.write(ReleasePlan("r", scheduled["id"], before.outbox_seq))
    assert not backend.write(commit)
    # The store retries the commit on the reloaded document: the next number.
    store.handle("r", ping, handlers)
    seqs = [e["seq"] for e in store.get("r").raw_outbox]
    assert sorted(seqs) == [1, 2, 3] and store.get("r").outbox_seq == 3
    # A commit that lands first makes a release read before it fail (outbox_seq moved).
    store.handle("r", msg("s2", "Start", after=60, key="j"), handlers)
    [second] = [e for e in store.get("r").raw_outbox if e.get("key") == "j"]
    stale = store.get("r").outbox_seq
    store.handle("r", msg("p2", "Ping"), handlers)
    assert not backend.write(ReleasePlan("r", second["id"], stale))
    assert backend.write(ReleasePlan("r", second["id"], stale + 1))
    seqs = [e["seq"] for e in store.get("r").raw_outbox]
    assert sorted(seqs) == [1, 2, 3, 4, 5]


def test_a_release_and_a_commit_from_one_outbox_seq_never_share_a_seq() -> None:
    check_release_and_commit_never_share_a_seq(MemoryBackend())


def test_one_run_releases_several_due_entries_in_turn() -> None:
    world = World()
    world.handle("t", msg("s1", "Start", after=1, key="a"))
    world.handle("t", msg("s2", "Start", after=2, key="b"))
    world.handle("t", msg("p", "Ping"))
    doc = world.backend.load("t")
    assert doc is not None
    result = run_flow(world, doc, BASE + timedelta(hours=1))
    assert result.raced == [] and len(result.published) == 3
    stored = world.backend.docs["t"]
    assert stored["outbox"] == [] and stored["outbox_seq"] == 3
    assert "earliest_due" not in stored  # the settle counted the run's own releases


def test_the_immediate_path_reloads_released_entries_in_their_seq_order() -> None:
    world = World()
    world.handle("t", msg("s", "Start", after=1, key="a"))
    world.handle("t", msg("p0", "Ping"))
    world.handle("t", msg("s2", "Start", after=9, key="b"))
    [first, _, waiting] = world.backend.docs["t"]["outbox"]
    assert world.backend.write(ReleasePlan("t", first["id"], 1))
    snapshot = world.timers.get("t")
    below = _immediate(snapshot.raw_outbox, snapshot.outbox)
    # The released entry (stored first, seq 2) is numbered: the immediate path publishes
    # it in seq order; the one not released yet is left to the regular dispatcher.
    assert [(e.type, e.seq) for e in below] == [("Pong", 1), ("Timeout", 2)]
    assert waiting["id"] not in {e.id for e in below}
