"""The shortcuts of the handle hot path give exactly what the long way gives."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
import pytest
from pydantic import BaseModel

from docoutbox import Decision, emit
from docoutbox.errors import InvalidHandlerResult, InvalidPayload
from docoutbox.handlers import check_result
from docoutbox.store.document import from_millis, read_snapshot
from docoutbox.store.plans import CommitPlan, appended, apply_plan, committed, kept_window
from docoutbox_mongo.backend import bson_size

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "millis",
    [0, 1, 999, 1_000, 1_763_856_000_123, 2**32 * 1000 - 1, 2**32 * 1000, 253_402_300_799_999],
)
def test_from_millis_is_exact_at_the_edges(millis: int) -> None:
    assert from_millis(millis) == EPOCH + timedelta(milliseconds=millis)


def test_from_millis_is_exact_for_random_times() -> None:
    rng = random.Random(11)
    for _ in range(200_000):
        millis = rng.randrange(0, 2**32 * 1000)
        assert from_millis(millis) == EPOCH + timedelta(milliseconds=millis)


class Small(BaseModel):
    n: int = 0


class Larger(Small):
    more: int = 1


def test_a_bare_state_becomes_the_decision_the_constructor_makes() -> None:
    state = Small(n=2)
    fast = check_result(state, Small)
    slow = Decision(state)
    assert (fast.state, fast.emits) == (slow.state, slow.emits)
    assert fast == slow
    assert type(fast) is Decision


def test_other_results_still_take_the_checked_way() -> None:
    with pytest.raises(InvalidHandlerResult):
        check_result(Larger(), Small)  # a subclass is not the model
    with pytest.raises(InvalidHandlerResult):
        check_result({"n": 1}, Small)
    decision = check_result(Decision(Small(), emit("E")), Small)
    assert [e.type for e in decision.emits] == ["E"]


def _inbox(rng: random.Random, count: int) -> list[Any]:
    alphabet = ["a", "Z", "0", "-", "\x00", "é", "€", "\U0001f600"]
    ascii_only = rng.random() < 0.7
    items: list[Any] = []
    for _ in range(count):
        letters = alphabet[:4] if ascii_only else alphabet
        items.append("".join(rng.choice(letters) for _ in range(rng.randint(0, 40))))
    if count and rng.random() < 0.1:
        items[rng.randrange(count)] = rng.choice([7, None, 2.5, ["x"], {"k": "v"}])
    return items


def test_counted_bson_size_is_the_encoded_size() -> None:
    rng = random.Random(5)
    for _ in range(3000):
        count = rng.choice([0, 1, 7, 8, 9, 10, 11, 99, 100, 101, 1000, 1001, rng.randint(0, 300)])
        doc = {
            "_id": rng.choice(["a", 7, "é" * 3]),
            "version": rng.randint(0, 2**40),
            "state": {"n": rng.randint(-5, 5), "text": "é" * rng.randint(0, 3)},
            "inbox": _inbox(rng, count),
            "outbox": [{"id": "e1", "seq": 1}] * rng.randint(0, 2),
            "updated_at": EPOCH,
        }
        if rng.random() < 0.2:
            doc["inbox"] = tuple(doc["inbox"])
        assert bson_size(doc) == len(bson.encode(doc))


@pytest.mark.parametrize("count", [3, 30])
def test_bson_size_still_refuses_what_bson_cannot_encode(count: int) -> None:
    with pytest.raises(InvalidPayload):
        bson_size({"_id": "a", "inbox": ["m"] * count, "state": {"x": object()}})
    with pytest.raises(InvalidPayload):
        bson_size({"_id": "a", "inbox": ["m"] * count + [{1, 2}]})
    with pytest.raises(InvalidPayload):
        bson_size({"_id": "a", "inbox": ["m"] * count + ["\ud800"]})


def test_appended_is_append_then_keep_the_window() -> None:
    rng = random.Random(2)
    for _ in range(20_000):
        inbox = tuple(f"m{i}" for i in range(rng.randint(0, 12)))
        window = rng.randint(1, 14)
        assert appended(inbox, "new", window) == (*inbox, "new")[-window:]


def test_kept_window_is_append_then_slice() -> None:
    rng = random.Random(4)
    for _ in range(20_000):
        items: Any = [f"m{i}" for i in range(rng.randint(0, 12))]
        if rng.random() < 0.3:
            items = tuple(items)
        push = tuple(f"p{i}" for i in range(rng.randint(1, 4)))
        window = rng.randint(-3, 14)
        before = list(items)
        assert kept_window(items, push, window) == [*items, *push][-window:]
        assert list(items) == before  # never changed in place


def inbox_commit(inbox: tuple[str, ...], message_id: str) -> CommitPlan:
    """A commit of aggregate ``a`` at version 3 setting ``{"n": 1}`` and adding
    ``message_id`` to ``inbox`` in a window of 2, nothing to the outbox."""
    return CommitPlan(
        aggregate_id="a",
        expected_version=3,
        state={"n": 1},
        outbox_push=(),
        outbox_seq=0,
        inbox_push=(message_id,),
        inbox_window=2,
        inbox_after=appended(inbox, message_id, 2),
        inbox_marks=None,
        updated_at=EPOCH,
    )


def test_a_commit_plan_applies_to_its_version_and_to_no_missing_document() -> None:
    doc = {"_id": "a", "version": 3, "state": {}, "inbox": ["x"], "outbox": [], "outbox_seq": 0}
    plan = inbox_commit(("x",), "y")
    after = apply_plan(doc, plan)
    assert after is not None
    assert (after["version"], after["state"], after["inbox"]) == (4, {"n": 1}, ["x", "y"])
    assert apply_plan(None, plan) is None
    assert apply_plan({**doc, "version": 2}, plan) is None


def test_a_commit_builds_the_new_inbox_once() -> None:
    """The store's copy of the committed document shares the plan's inbox tuple, and the
    next snapshot reads it without a copy; apply_plan gives the same document with a
    list, as a database returns it."""
    doc = {
        "_id": "a",
        "type": "Small",
        "version": 3,
        "state": {"n": 0},
        "inbox": ["x", "y"],
        "outbox": [],
        "outbox_seq": 0,
    }
    plan = inbox_commit(("x", "y"), "z")
    after = committed(doc, plan)
    assert after is not None
    assert after["inbox"] is plan.inbox_after
    assert read_snapshot(after, Small).inbox is plan.inbox_after
    listed = apply_plan(doc, plan)
    assert listed == {**after, "inbox": ["y", "z"]}
    assert doc["inbox"] == ["x", "y"]  # never changed in place
