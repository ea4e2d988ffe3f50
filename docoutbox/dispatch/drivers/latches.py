"""Flags whose setter never blocks, so a signal handler may set them, each one plain lock:
the threaded dispatcher's stop and wake-up flags, and the replies of the RabbitMQ
publisher's hand-off to its loop thread.

A signal handler runs on the main thread between two of its lines, and the main thread is
often the one running the dispatcher's loop. ``threading.Event.set`` takes the event's
lock, which the loop holds inside ``Event.wait`` and ``Event.clear``: a handler landing
there waits for its own thread forever. Rule kept here: setting a flag only *releases* a
plain lock, which never blocks, and waiting is acquiring it (with a timeout).
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["Latch", "Wakeup"]


def _timeout(seconds: float | None) -> float:
    return -1 if seconds is None else max(seconds, 0.0)


class Latch:
    """Set once, and then seen by every waiter (a stop request)."""

    def __init__(self) -> None:
        self._set = False
        self._gate = threading.Lock()
        self._gate.acquire()  # closed until set

    def set(self) -> None:
        self._set = True
        with contextlib.suppress(RuntimeError):  # already open
            self._gate.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting at most ``timeout`` seconds (None: until it is)."""
        if self._set:
            return True
        if self._gate.acquire(timeout=_timeout(timeout)):
            with contextlib.suppress(RuntimeError):  # a concurrent set() opened it already
                self._gate.release()  # open again, for the other waiters
        return self._set


class Wakeup:
    """A wake-up call for the one thread that waits on it: pending from :meth:`set` until
    a :meth:`wait` or :meth:`clear` takes it."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()  # closed: no call pending

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # one is pending already
            self._gate.release()

    def is_set(self) -> bool:
        return not self._gate.locked()

    def clear(self) -> None:
        self._gate.acquire(blocking=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether a call came (and take it), waiting at most ``timeout`` seconds."""
        return self._gate.acquire(timeout=_timeout(timeout))
