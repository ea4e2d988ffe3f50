"""The threaded dispatcher's signal-safe flags, on one thread (waiters on other threads:
``tests/integration/test_stop_from_signal.py``)."""

from __future__ import annotations

from docoutbox.dispatch.drivers.latches import Latch, Wakeup


def test_a_latch_is_unset_until_set_and_then_stays_set() -> None:
    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0) is False
    assert latch.wait(-1.0) is False  # a negative timeout does not wait
    latch.set()
    latch.set()  # twice is harmless
    assert latch.is_set()
    assert latch.wait(0) is True
    assert latch.wait(None) is True
    assert latch.wait(0) is True  # every waiter sees it, not just the first


def test_a_wakeup_is_taken_by_one_wait() -> None:
    wake = Wakeup()
    assert not wake.is_set()
    assert wake.wait(0) is False
    wake.set()
    wake.set()  # a second call while one is pending is the same call
    assert wake.is_set()
    assert wake.wait(None) is True
    assert not wake.is_set()
    assert wake.wait(0) is False


def test_a_cleared_wakeup_is_not_pending() -> None:
    wake = Wakeup()
    wake.set()
    wake.clear()
    assert not wake.is_set()
    assert wake.wait(0) is False
    wake.clear()  # clearing with none pending does not block
    wake.set()
    assert wake.wait(-1.0) is True
