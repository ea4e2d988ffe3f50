"""The batch contract: ``handle_batch`` and group commit on every store backend.

Reuse it like :mod:`docoutbox.testing.contract`: subclass :class:`BatchContract` and
provide the same ``make_store`` fixture. A batch's commit pushes several inbox IDs and
outbox entries in one write, which every adapter must translate faithfully.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from docoutbox.model import InboxPolicy, Message
from docoutbox.store.batch import Failed
from docoutbox.store.core import StoreConfig
from docoutbox.testing.contract import Counter, add_msg, counter_handlers

MakeStore = Callable[..., Any]


class BatchContract:
    """Behaviour of batch handling that every store backend must show."""

    def test_a_batch_commits_state_inbox_and_outbox_in_one_write(
        self, make_store: MakeStore
    ) -> None:
        store = make_store(Counter)
        store.create("c1", Counter())
        messages = [add_msg(f"m{i}", n=i, emits=2) for i in range(1, 6)]
        result = store.handle_batch("c1", messages, counter_handlers)
        assert all(r.applied for r in result.results)
        assert (result.writes, result.commits) == (1, 1)
        snap = store.get("c1")
        assert snap.version == 1
        assert snap.state.total == 15
        assert list(snap.inbox) == [f"m{i}" for i in range(1, 6)]
        assert [e.seq for e in snap.outbox] == list(range(1, 11))
        assert [e.causation_id for e in snap.outbox][::2] == [f"m{i}" for i in range(1, 6)]
        again = store.handle_batch("c1", messages, counter_handlers)
        assert all(r.duplicate for r in again.results) and again.writes == 0

    def test_a_failing_message_is_left_out_of_the_commit(self, make_store: MakeStore) -> None:
        store = make_store(Counter)
        store.create("c1", Counter())
        messages = [add_msg("m1"), Message(id="bad", type="Nope"), add_msg("m3")]
        result = store.handle_batch("c1", messages, counter_handlers)
        assert isinstance(result.results[1], Failed)
        snap = store.get("c1")
        assert snap.state.applied == ["m1", "m3"]
        assert "bad" not in snap.inbox

    def test_a_batch_beyond_the_window_keeps_the_window_bounded(
        self, make_store: MakeStore
    ) -> None:
        store = make_store(Counter, StoreConfig(inbox=InboxPolicy(window=3)))
        store.create("c1", Counter())
        messages = [add_msg(f"m{i}") for i in range(7)] + [add_msg("m1")]
        result = store.handle_batch("c1", messages, counter_handlers)
        assert result.results[-1].duplicate
        assert result.commits == 3
        snap = store.get("c1")
        assert snap.state.applied == [f"m{i}" for i in range(7)]
        assert list(snap.inbox) == ["m4", "m5", "m6"]

    def test_exact_marks_in_a_batch(self, make_store: MakeStore) -> None:
        store = make_store(Counter, StoreConfig(inbox=InboxPolicy(window=0, exact=True)))
        store.create("c1", Counter())
        seqs = [2, 1, 2, 4]
        messages = [add_msg(f"i{s}", source="P/1", seq=s) for s in seqs]
        result = store.handle_batch("c1", messages, counter_handlers)
        assert [r.applied for r in result.results] == [True, True, False, True]
        mark = store.get("c1").marks["P/1"]
        assert (mark.hw, mark.above) == (2, (4,))

    def test_a_new_aggregate_is_created_by_its_first_batch(self, make_store: MakeStore) -> None:
        store = make_store(Counter)
        result = store.handle_batch(
            "n1", [add_msg("a"), add_msg("b")], counter_handlers, create=True
        )
        assert all(r.applied for r in result.results)
        assert store.get("n1").state.applied == ["a", "b"]
