"""The unit tier's rule: a unit test starts no thread, socket, event loop or sleep.

Every test here runs with ``socket.socket``, ``socket.socketpair``,
``socket.create_connection``, ``threading.Thread.start`` and ``time.sleep`` replaced by
functions that raise :class:`ForbiddenInUnitTests`. An event loop opens a socketpair, so
``asyncio.run`` and ``asyncio.new_event_loop`` are refused too. A test that needs any of
them belongs in ``tests/integration/`` (with the servers), or drives the sans-IO engine and
flows with an injected clock, as ``tests/simulation/`` does. Wall-clock reads are kept out
by ``test_tier_rules.py``, which reads this tier's sources.

The error derives from ``BaseException``, not ``Exception``: a library that catches
``Exception`` around a publish or a poll (to retry it) must not hide the violation.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, NoReturn

import pytest


class ForbiddenInUnitTests(BaseException):
    """A unit test reached a thread, a socket, an event loop or a sleep."""


def _describe(thread: Any) -> str:
    """A thread's name and what runs on it (its target's, else its class's, module and
    name): ``'Thread-1' (py4j.clientserver.FinalizerWorker)``."""
    runs = getattr(thread, "_target", None) or type(thread)
    origin = f"{getattr(runs, '__module__', '?')}.{getattr(runs, '__qualname__', '?')}"
    return f"{getattr(thread, 'name', '?')!r} ({origin})"


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        thread = threading.current_thread()
        if thread is not threading.main_thread():
            # Not the test's own thread (the tier starts none): one left running by an
            # earlier tier of the same pytest run.
            raise ForbiddenInUnitTests(
                f"{what} on thread {_describe(thread)}, which was running before this unit "
                "test: a client, session or pool an earlier test or fixture of this run "
                "left open; close it where it was opened"
            )
        raise ForbiddenInUnitTests(
            f"{what} in a unit test: move the test to tests/integration/, or drive the "
            "sans-IO engine with an injected clock (see tests/README.md, 'Test tiers')"
        )

    return refused


#: What the unit tier refuses: (owner, attribute, what the error calls it).
FORBIDDEN: list[tuple[Any, str, str]] = [
    (socket, "socket", "socket.socket (a socket, or an event loop's self-pipe)"),
    (socket, "socketpair", "socket.socketpair (an event loop's self-pipe)"),
    (socket, "create_connection", "socket.create_connection"),
    (threading.Thread, "start", "threading.Thread.start"),
    (time, "sleep", "time.sleep"),
]


@pytest.fixture(autouse=True)
def no_threads_sockets_or_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every thread start, socket, event loop and sleep for one unit test."""
    for owner, name, what in FORBIDDEN:
        monkeypatch.setattr(owner, name, _refuse(what))
