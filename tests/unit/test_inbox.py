"""Exact watermark de-duplication: exact, bounded, tolerant of reordering."""

from __future__ import annotations

import random

import pytest

from docoutbox import InboxPolicy, Message
from docoutbox.errors import InboxSaturated
from docoutbox.store.inbox import Mark, is_duplicate, record_mark

EXACT = InboxPolicy(window=0, exact=True, max_above=50)


def msg(seq: int, source: str = "P/1") -> Message:
    return Message(id=f"{source}-{seq}-{random.random()}", type="T", source=source, seq=seq)


def test_mark_compacts_contiguous_numbers() -> None:
    mark = Mark("s", 0)
    for seq in [3, 1, 2, 5]:
        mark = mark.record(seq)
    assert (mark.hw, mark.above) == (3, (5,))
    assert mark.seen(2) and mark.seen(5) and not mark.seen(4)


@pytest.mark.parametrize("seed", range(20))
def test_shuffled_stream_with_repeats_is_deduplicated_with_bounded_state(seed: int) -> None:
    rng = random.Random(seed)
    stream = [s for s in range(1, 301) for _ in range(rng.randint(1, 3))]
    # Reorder within a bounded window, as a broker would.
    for i in range(len(stream)):
        j = min(len(stream) - 1, i + rng.randint(0, 10))
        stream[i], stream[j] = stream[j], stream[i]
    marks: dict[str, Mark] = {}
    applied: list[int] = []
    peak = 0
    for seq in stream:
        message = msg(seq)
        if is_duplicate(EXACT, (), marks, message):
            continue
        marks = {m.source: m for m in record_mark(EXACT, marks, message)}
        applied.append(seq)
        peak = max(peak, len(marks["P/1"].above))
    assert sorted(applied) == list(range(1, 301))
    assert (marks["P/1"].hw, marks["P/1"].above) == (300, ())
    assert peak <= 50


def test_sources_are_independent() -> None:
    marks = {m.source: m for m in record_mark(EXACT, {}, msg(1, "A/1"))}
    assert is_duplicate(EXACT, (), marks, msg(1, "A/1"))
    assert not is_duplicate(EXACT, (), marks, msg(1, "B/1"))


def test_saturation_is_refused_not_forgotten() -> None:
    marks: dict[str, Mark] = {}
    for seq in range(2, 52):
        marks = {m.source: m for m in record_mark(EXACT, marks, msg(seq))}
    with pytest.raises(InboxSaturated):
        record_mark(EXACT, marks, msg(60))
    marks = {m.source: m for m in record_mark(EXACT, marks, msg(1))}
    assert marks["P/1"].hw == 51


def test_messages_without_source_fall_back_to_the_id_window() -> None:
    policy = InboxPolicy(window=10, exact=True)
    plain = Message(id="m1", type="T")
    assert is_duplicate(policy, ("m1",), {}, plain)
    assert not is_duplicate(policy, ("m2",), {}, plain)
