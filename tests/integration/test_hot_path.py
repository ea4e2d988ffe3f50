"""The shortcuts of the handle hot path give exactly what the long way gives.

Here: ``utcnow`` read against the wall clock; the pure shortcuts are in
``tests/unit/test_hot_path.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from docoutbox.store.document import utcnow


def test_utcnow_is_whole_milliseconds_in_utc() -> None:
    now = utcnow()
    assert now.tzinfo is UTC
    assert now.microsecond % 1000 == 0
    assert abs(datetime.now(UTC) - now) < timedelta(seconds=5)
