"""Calls from any thread carried out on one event loop thread, with one wake-up for every
call that arrives while the loop has not yet taken the earlier ones.

Rule: a call is queued with its :class:`Reply`; only the call that finds the queue not
yet scheduled wakes the loop (``call_soon_threadsafe``), and the loop starts every call
queued by then as a task of its own, in the order they were queued. Each reply is
settled exactly once: with the task's result or error, or, if the caller stops waiting
(:meth:`Reply.wait` timed out) or the loop stops first (:meth:`Handoff.fail_queued`),
with ``BrokerUnavailable``; a call that cannot even start raises its error to its caller
alone. A task whose caller stopped waiting is cancelled: the cancel is queued on the
loop after the start, so a call that had not started yet is cancelled before its first
step. :meth:`Handoff.shut` ends the calls still running with ``BrokerUnavailable``
(cancelled and awaited, never left pending on a stopped loop) and starts none after.
The threaded dispatcher's workers hand their rounds over in bursts (an ack with
``multiple`` ends several rounds at once): one wake-up per burst, not per round, and no
``concurrent.futures`` future (a condition and a callback chain) per round.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from docoutbox.dispatch.drivers.latches import Latch
from docoutbox.errors import BrokerUnavailable

#: The error of a call that the publisher's closing ended or refused.
CLOSED = "RabbitMQ publisher: closed during the call"
#: A call: the coroutine to run on the loop.
Work = Callable[[], Coroutine[Any, Any, Any]]


class Reply:
    """The outcome of one call, awaited by the thread that made it."""

    __slots__ = ("_done", "_error", "_lock", "_result", "task")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # settles the reply once
        self._done = Latch()
        self._result: Any = None
        self._error: BaseException | None = None
        #: The task running the call, once the loop started it (read on the loop only).
        self.task: asyncio.Task[Any] | None = None

    def settle(self, result: Any = None, error: BaseException | None = None) -> bool:
        """Settle the reply (the first settle wins); False if it was settled already."""
        with self._lock:
            if self._done.is_set():
                return False
            self._result, self._error = result, error
            self._done.set()
            return True

    def finished(self, task: asyncio.Task[Any]) -> None:
        """The task's done callback: its result or error settles the reply."""
        if task.cancelled():
            self.settle(error=BrokerUnavailable("the call was cancelled before it finished"))
        elif (error := task.exception()) is not None:
            self.settle(error=error)
        else:
            self.settle(task.result())

    def wait(self, timeout: float) -> Any:
        """The call's result (its error is raised); ``TimeoutError`` if it is still
        unsettled after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError
        if self._error is not None:
            raise self._error
        return self._result


class Handoff:
    """Hands calls to the loop of ``loop`` (see the module's rule)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._queue: list[tuple[Work, Reply]] = []
        self._scheduled = False
        #: The calls started and not yet finished, and whether :meth:`shut` began (loop only).
        self._running: dict[asyncio.Task[Any], Reply] = {}
        self._shut = False
        #: Wake-ups of the loop so far (each a ``call_soon_threadsafe``).
        self.wakeups = 0

    def submit(self, work: Work) -> Reply:
        """Queue ``work`` for the loop; its reply settles once it has run."""
        reply = Reply()
        with self._lock:
            self._queue.append((work, reply))
            if self._scheduled:
                return reply
            self._scheduled = True
            self.wakeups += 1
        self.loop.call_soon_threadsafe(self._start)
        return reply

    def call(self, work: Work, timeout: float) -> Any:
        """Run ``work`` on the loop and return its result; ``BrokerUnavailable`` if it has
        not finished within ``timeout`` seconds (it is then cancelled)."""
        reply = self.submit(work)
        try:
            return reply.wait(timeout)
        except TimeoutError:
            gone = BrokerUnavailable(f"RabbitMQ publisher: no answer within {timeout:.0f}s")
            if reply.settle(error=gone):
                self._cancel(reply)
            return reply.wait(0)

    def shut(self, last: Work, timeout: float) -> Any:
        """End every call still running with ``BrokerUnavailable`` (each is cancelled and
        awaited), refuse every later one, then run ``last`` (closing what the calls used)
        and return its result."""

        async def shutting() -> Any:
            self._shut = True
            running = [task for task in self._running if task is not asyncio.current_task()]
            for task in running:
                self._running[task].settle(error=BrokerUnavailable(CLOSED))
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            return await last()

        return self.call(shutting, timeout)

    def fail_queued(self, error: BrokerUnavailable) -> None:
        """Settle every call not yet started with ``error`` (the loop is stopping)."""
        with self._lock:
            queued, self._queue = self._queue, []
            self._scheduled = False
        for _, reply in queued:
            reply.settle(error=error)

    def _start(self) -> None:
        with self._lock:
            queued, self._queue = self._queue, []
            self._scheduled = False
        for work, reply in queued:
            if self._shut:
                reply.settle(error=BrokerUnavailable(CLOSED))
                continue
            try:
                task = self.loop.create_task(work())
            except Exception as exc:  # noqa: BLE001 - raised to its caller; the others start
                reply.settle(error=exc)
                continue
            reply.task = task
            self._running[task] = reply
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.pop(task).finished(task)

    def _cancel(self, reply: Reply) -> None:
        def cancel() -> None:
            if reply.task is not None:
                reply.task.cancel()

        with contextlib.suppress(RuntimeError):  # a closed loop: nothing runs any more
            self.loop.call_soon_threadsafe(cancel)
