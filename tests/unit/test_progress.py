"""The dispatcher's progress lines: a fresh backlog (on every line, and on the last one),
``lag_s`` of the entries published since the previous line (0 when idle), the pace of
``--progress-interval``, and a short checkpoint in the stop line."""

from __future__ import annotations

import argparse
import base64
import logging
import re
from datetime import UTC, datetime

import pytest

from docoutbox import AggregateStore
from docoutbox.dispatch.engine.backlog import BacklogMonitor, Fanout, OutboxStats, ProgressMetrics
from docoutbox.dispatch.engine.checkpoint import describe_position
from docoutbox.dispatch.engine.metrics import LoggingMetrics
from docoutbox.model import OutboxMessage
from docoutbox.testing import MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_app.cli.observe import Observability

#: The measurement time of the figures (data only: no clock is read).
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _entry() -> OutboxMessage:
    store = AggregateStore(MemoryBackend(), Counter)
    return store.handle("c", add_msg("m", emits=1), counter_handlers, create=True).emitted[0]


def _stats(entries: int) -> OutboxStats:
    return OutboxStats(entries, min(entries, 1), 0.0, None, T0)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress")]


def _field(line: str, name: str) -> str:
    found = re.search(rf"\b{name}=(\S+)", line)
    assert found is not None, line
    return found.group(1)


def test_lag_is_that_of_the_entries_published_since_the_previous_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    progress = ProgressMetrics(every=1)
    entry = _entry()
    with caplog.at_level(logging.INFO, "docoutbox.metrics"):
        progress.published(entry, 20.5)
        progress.published(entry, 3.0)
        progress.report()
        progress.report()  # idle and caught up since the previous line
    first, idle = _lines(caplog)
    assert _field(first, "lag_s") == "20.500"
    assert _field(idle, "lag_s") == "0.000"


def test_lines_keep_the_interval_when_measurements_are_as_frequent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    progress = ProgressMetrics(every=2, monotonic=lambda: clock[0])
    monitor = BacklogMonitor(lambda: _stats(0), Fanout(progress), interval=2)
    with caplog.at_level(logging.INFO, "docoutbox.metrics"):
        for step in range(1, 11):  # measured every 2 s, each taking 0.1 s
            clock[0] = step * 2.1
            monitor.measure()
    assert len(_lines(caplog)) == 10


def _observability(probe_values: list[int], progress: float, backlog: float) -> Observability:
    args = argparse.Namespace(
        metrics_port=None,
        metrics_host="127.0.0.1",
        backlog_interval=backlog,
        progress_interval=progress,
        otel=False,
    )
    return Observability(args, lambda: _stats(probe_values[0]))


def test_the_backlog_is_measured_at_least_as_often_as_progress_lines() -> None:
    assert _observability([0], progress=2, backlog=5).monitor.interval == 2
    assert _observability([0], progress=10, backlog=5).monitor.interval == 5


def test_the_last_line_measures_the_backlog_again(caplog: pytest.LogCaptureFixture) -> None:
    values = [3000]
    seen = _observability(values, progress=10, backlog=5)
    seen.monitor.measure()  # while 3000 entries were pending
    values[0] = 0  # drained since
    with caplog.at_level(logging.INFO, "docoutbox.metrics"):
        seen.close()
    (line,) = _lines(caplog)
    assert _field(line, "backlog_entries") == "0"


def test_a_long_checkpoint_is_shown_by_size_and_hash() -> None:
    token = {"_data": "6b026fbb00000004"}
    assert describe_position(token) == repr(token)  # a MongoDB resume token, as it is
    continuation = base64.b64encode(bytes(range(256)) * 12).decode()  # 4 KB
    shown = describe_position(continuation)
    assert len(shown) < 80 and str(len(repr(continuation))) in shown and "sha256" in shown
    lanes = {f"range{i}": continuation for i in range(4)}
    shown = describe_position(lanes)
    assert len(shown) < 80 and "4 parts" in shown
    assert describe_position({**lanes, "range0": "x"}) != shown  # tells positions apart
    assert describe_position(None) == "None"


def test_logging_metrics_report_no_lag_when_idle(caplog: pytest.LogCaptureFixture) -> None:

    metrics = LoggingMetrics(every=1)
    metrics.published(_entry(), 20.5)
    with caplog.at_level(logging.INFO, "docoutbox.metrics"):
        metrics.report()
        metrics.report()
    first, idle = _lines(caplog)
    assert _field(first, "lag_s") == "20.500" and _field(idle, "lag_s") == "0.000"
    assert _field(idle, "max_lag_s") == "20.500"
