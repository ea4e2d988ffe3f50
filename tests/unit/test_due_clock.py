"""The due clock: when the dispatcher queries for scheduled entries fallen due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from docoutbox.dispatch.engine.due_clock import DueClock

BASE = datetime(2030, 1, 1, tzinfo=UTC)


def test_it_queries_at_once_then_periodically_and_at_every_due_time_seen() -> None:
    now = [0.0]
    clock = DueClock(0.5, lambda: now[0], lambda: BASE + timedelta(seconds=now[0]))
    assert clock.ready(0.0)
    clock.scanned(0.0, None)
    assert not clock.ready(0.1) and clock.wait(0.1) == 0.4
    clock.expect(BASE + timedelta(seconds=0.2))
    clock.expect(BASE + timedelta(seconds=0.3))
    clock.note({"earliest_due": BASE + timedelta(seconds=0.25)})
    for due in (0.2, 0.25, 0.3):
        assert not clock.ready(due - 0.01) and clock.ready(due)
        clock.scanned(due, None)  # each due time is queried at, not only the earliest
    assert clock.wait(0.3) == 0.5  # then the periodic query
    clock.expect(None)
    clock.note(None)
    assert clock.wait(0.3) == 0.5


def test_a_full_page_is_followed_at_once_and_an_acquired_scope_queries_soon() -> None:
    clock = DueClock(0.5, lambda: 0.0, lambda: BASE)
    clock.scanned(0.0, "k")
    assert clock.after == "k" and clock.ready(0.0)
    clock.scanned(0.0, None)
    assert clock.after is None and not clock.ready(0.1)
    clock.soon()
    assert clock.ready(0.1)
