"""Run by ``tests/integration/test_stop_from_signal.py`` in a child process: a
:class:`~docoutbox.dispatch.drivers.threads.Dispatcher` whose ``stop()`` is called on the
thread running its loop, at the N-th line that thread runs in the driver's modules or in
``threading`` (where a signal handler may land), for N = 1, 2, ... until the loop goes
idle before its N-th such line. A stop that waits for a lock the interrupted code holds
never returns, so the child hangs and its parent fails it.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

from docoutbox.dispatch.drivers import latches, threads
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints

#: Where a signal handler may interrupt the loop while it holds a lock of its own.
LOCKING = {threading.__file__, threads.__file__, latches.__file__}
#: After this long, the loop is idle: the point was not reached.
IDLE = 2.0
#: No more points than this are tried.
MOST = 150


def stop_at(point: int) -> bool:
    """Run one dispatcher and call its ``stop()`` at the ``point``-th line run in
    :data:`LOCKING` on this thread; whether that point was reached before the loop went
    idle (it is then stopped from another thread)."""
    backend = MemoryBackend()
    source = MemoryChangeSource(backend)
    dispatcher = Dispatcher(
        backend,
        MemoryPublisher(),
        MemoryDeadLetters(),
        source=source,
        checkpoints=MemoryCheckpoints(),
        config=DispatcherConfig(name="stop-anywhere", poll_interval=0.01),
    )
    seen = 0
    main = threading.get_ident()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        if threading.get_ident() != main or not dispatcher.started.is_set():
            return None
        if frame.f_code.co_filename not in LOCKING:
            return trace
        if event == "line":
            seen += 1
            if seen == point:
                dispatcher.stop()
        return trace

    idle = threading.Timer(IDLE, dispatcher.stop)
    idle.start()
    sys.settrace(trace)
    try:
        dispatcher.run()
    finally:
        sys.settrace(None)
        idle.cancel()
    return seen >= point


def main() -> int:
    point = 1
    while point <= MOST and stop_at(point):
        point += 1
    print(f"stopped at each of {point - 1} points", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
