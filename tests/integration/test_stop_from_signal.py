"""``Dispatcher.stop()`` may be called from a signal handler (``docoutbox dispatch`` does
on SIGTERM). A handler runs on the main thread between two of its lines, and that thread
is the one running the dispatcher's loop, so ``stop()`` must not wait for a lock that the
loop may hold at that moment: it would wait for itself, and the process would never exit.
The child stops a dispatcher at each line its loop runs inside ``threading`` in turn.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

from docoutbox.dispatch.drivers.latches import Latch, Wakeup

ROOT = Path(__file__).resolve().parents[2]

#: At least this many points are tried: the loop's first turns, its waits and clears.
POINTS = 50


def test_a_stop_called_at_any_line_of_the_loops_waits_returns() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.stop_anywhere"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"a stop() called on the loop's own thread never returned: {exc.stdout!r}"
        ) from None
    assert done.returncode == 0, done.stdout + done.stderr
    tried = re.search(r"stopped at each of (\d+) points", done.stdout)
    assert tried is not None, done.stdout
    assert int(tried.group(1)) >= POINTS


def test_every_thread_waiting_on_a_latch_sees_it_set() -> None:
    latch = Latch()
    seen: list[bool] = []
    waiters = [threading.Thread(target=lambda: seen.append(latch.wait(None))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    waiters[0].join(0.2)
    assert seen == []  # waiting until it is set
    latch.set()
    for waiter in waiters:
        waiter.join(10)
    assert seen == [True, True, True]


def test_a_wakeup_set_from_another_thread_ends_a_wait() -> None:
    wake = Wakeup()
    seen: list[bool] = []
    waiter = threading.Thread(target=lambda: seen.append(wake.wait(None)))
    waiter.start()
    waiter.join(0.2)
    assert seen == []
    wake.set()
    waiter.join(10)
    assert seen == [True]
    assert not wake.is_set()  # the wait took it
