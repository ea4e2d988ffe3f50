"""The drain counter's arithmetic: CPU per entry by thread group, switches, stream reads."""

from __future__ import annotations

from benchmarks.drain_counts import Counting, by_group, switches


def test_cpu_is_summed_per_group_of_like_named_threads_and_per_entry() -> None:
    before = {1: ("docoutbox-dispatch_0", 1_000_000, 5), 2: ("rdk:broker1", 0, 0)}
    after = {
        1: ("docoutbox-dispatch_0", 3_000_000, 9),
        2: ("rdk:broker1", 500_000, 2),
        3: ("docoutbox-dispatch_1", 2_000_000, 4),  # began after the first snapshot
        4: ("idle", 0, 0),
    }
    assert by_group(before, after, entries=1000) == {
        "docoutbox-dispatch#": 4.0,
        "rdk:broker#": 0.5,
    }
    assert switches(before, after) == 4 + 2 + 4


def test_reads_events_and_empty_reads_are_counted() -> None:
    counting = Counting()
    counting.poll((100,), ["a", "b"])
    counting.poll((100,), [])
    counting.publish_round(([1, 2, 3],), None)
    assert counting.counts == {
        "stream reads": 2,
        "events": 2,
        "empty reads": 1,
        "publish rounds": 1,
        "round entries": 3,
    }
