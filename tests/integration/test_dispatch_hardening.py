"""Dispatcher behaviour guarded by issue-level tests: paged sweeps, polling mode, and
broker-down logging once per state change."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from docoutbox import OutboxMessage
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.errors import BrokerUnavailable
from docoutbox.testing import MemoryPublisher
from tests.integration.test_dispatch_engine import FAST, Harness, wait_until


def _run(dispatcher: Dispatcher) -> threading.Thread:
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    assert dispatcher.started.wait(5)
    return thread


def test_a_sweep_pages_through_every_pending_aggregate() -> None:
    """A sweep that stopped after its first page would leave 17 of these 20 behind: the
    only sweep is the one at start-up (no stream, no periodic sweep within the test)."""
    h = Harness()
    for i in range(20):
        h.write(f"a{i:02d}", f"m{i}")
    config = DispatcherConfig(
        name="t",
        sweep_page=3,
        sweep_interval=3600,
        poll_interval=0.005,
        policy=FAST.policy,
        backoff=FAST.backoff,
    )
    dispatcher = Dispatcher(h.backend, h.publisher, h.dead, ownership=SoleOwner(), config=config)
    thread = _run(dispatcher)
    try:
        wait_until(lambda: h.pending() == 0)
    finally:
        dispatcher.stop()
        thread.join(10)
    assert len(h.publisher.published) == 20


def test_without_a_change_source_the_default_is_polling_within_a_second_or_two() -> None:
    h = Harness()
    dispatcher = Dispatcher(h.backend, h.publisher, h.dead)
    assert dispatcher.config.sweep_interval <= 1.0 and dispatcher.config.grace == 0.0
    thread = _run(dispatcher)
    try:
        time.sleep(0.2)
        h.write("late", "m1")
        start = time.monotonic()
        wait_until(lambda: len(h.publisher.published) == 1, timeout=10)
        assert time.monotonic() - start < 2.5
    finally:
        dispatcher.stop()
        thread.join(10)


def test_broker_down_is_logged_once_per_state_change(caplog: pytest.LogCaptureFixture) -> None:
    down = threading.Event()
    down.set()
    failures = 0

    def fail(entry: OutboxMessage) -> BaseException | None:
        nonlocal failures
        if down.is_set():
            failures += 1
            return BrokerUnavailable("connection refused")
        return None

    h = Harness(MemoryPublisher(fail=fail))
    caplog.set_level(logging.INFO, logger="docoutbox")
    h.start()
    for i in range(10):
        h.write(f"a{i % 5}", f"m{i}")
    wait_until(lambda: failures >= 10)
    down.clear()
    wait_until(lambda: h.pending() == 0)
    h.stop()
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("broker_unavailable" in m for m in messages) == 1, messages
    assert sum("broker_available_again" in m for m in messages) == 1, messages
    assert not any("publish_failed" in m for m in messages), messages
