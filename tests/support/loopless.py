"""Run a coroutine without an event loop, for unit tests of async code on in-memory ports.

Rule: a coroutine that never waits on a future (memory backends, memory sources, the
async twins of the sans-IO flows) is driven here by ``send(None)`` alone, so a unit test
runs it with no event loop, no self-pipe socket and no thread. A bare ``yield`` (what
``asyncio.sleep(0)`` does) is resumed at once. Anything else the coroutine yields is a
future an event loop would have to complete: that is refused with :class:`NeedsLoop`, and
the test belongs in ``tests/integration/``.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class NeedsLoop(AssertionError):
    """The coroutine waited on a future: it needs a real event loop."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive ``coro`` to its end without an event loop and return its result."""
    try:
        while True:
            waited = coro.send(None)
            if waited is not None:
                raise NeedsLoop(f"{coro!r} waited on {waited!r}: it needs an event loop")
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        coro.close()
