"""Drive a sans-IO flow: the one loop behind every store and dispatch flow.

A flow is a generator that yields operations and receives their results. :func:`drive`
performs each operation with a synchronous ``perform``, :func:`drive_async` with an
awaitable one. An :class:`Exception` raised by ``perform`` is thrown into the flow at its
``yield``, so the flow decides what it means. Anything else (``KeyboardInterrupt``,
:class:`Abandoned`) closes the flow and propagates.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")


class Abandoned(BaseException):
    """Raised by a ``perform`` to drop a flow mid-way (a stop during a sleep, a crash)."""


def drive(flow: Generator[Any, Any, T], perform: Callable[[Any], Any]) -> T:
    """Run ``flow`` to its end, performing each operation with ``perform``."""
    send: Any = None
    error: Exception | None = None
    while True:
        try:
            op = flow.send(send) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            send = perform(op)
        except Exception as exc:  # noqa: BLE001 - handed to the flow, which decides
            error = exc
        except BaseException:
            flow.close()
            raise


async def drive_async(flow: Generator[Any, Any, T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """The async twin of :func:`drive`."""
    send: Any = None
    error: Exception | None = None
    while True:
        try:
            op = flow.send(send) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            send = await perform(op)
        except Exception as exc:  # noqa: BLE001 - handed to the flow, which decides
            error = exc
        except BaseException:
            flow.close()
            raise
