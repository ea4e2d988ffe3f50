"""A sync RabbitMQ publisher with confirms in flight, for the threaded dispatcher (needs the
``rabbitmq-aio`` extra: import it from ``docoutbox_rabbitmq.pipelined``).

Rule: every call is carried out by one :class:`~docoutbox_rabbitmq.aio.AsyncRabbitPublisher`
on one private event loop thread, so the rounds of all worker threads share one
confirm-mode channel (on the publisher's own connection), each sent whole before its
confirms are awaited. pika's blocking
channel cannot do that: it waits for each confirm inside ``basic_publish``. Calls reach
the loop through a :class:`~docoutbox_rabbitmq.handoff.Handoff`: the rounds of several
workers that arrive together share one wake-up of the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from docoutbox.errors import BrokerUnavailable
from docoutbox.model import OutboxMessage
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.handoff import CLOSED, Handoff

T = TypeVar("T")

#: Added to the publisher's own timeout before a caller stops waiting for the loop.
MARGIN = 30.0


class PipelinedRabbitPublisher:
    """A :class:`~docoutbox.ports.dispatch.PipelinedPublisher` for RabbitMQ, callable from
    any thread: :class:`~docoutbox_rabbitmq.aio.AsyncRabbitPublisher` (the same routing,
    properties, options and errors) run on an event loop thread of its own.

    ``publish`` returns once the entry is confirmed; ``publish_many`` sends a whole round,
    then waits for every confirm, and returns one outcome per entry. The loop thread
    starts on first use; :meth:`close` closes the connection and stops it (a later call
    starts a new one).
    """

    def __init__(self, url: str, exchange: str = "", **options: Any) -> None:
        self._args = (url, exchange)
        self._options = options
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._target: AsyncRabbitPublisher | None = None
        self._handoff: Handoff | None = None

    def __repr__(self) -> str:
        return f"<PipelinedRabbitPublisher exchange={self._args[1]!r}>"

    def publish(self, entry: OutboxMessage) -> None:
        self._call(lambda target: target.publish(entry))

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        outcomes: list[Exception | None] = self._call(lambda target: target.publish_many(entries))
        return outcomes

    def declare(
        self,
        *,
        exchange_type: str = "topic",
        queues: Mapping[str, Iterable[str]] | None = None,
        dead_letters: str | None = None,
    ) -> None:
        """Declare the exchange and queues, as ``AsyncRabbitPublisher.declare``."""
        self._call(
            lambda target: target.declare(
                exchange_type=exchange_type, queues=queues, dead_letters=dead_letters
            )
        )

    def check(self, *, declare_type: str | None = None) -> None:
        """Fail fast on an unusable broker, as ``AsyncRabbitPublisher.check``."""
        self._call(lambda target: target.check(declare_type=declare_type))

    def close(self) -> None:
        """Close the connection and stop the loop thread. Calls still in flight (rounds
        awaiting their confirms) fail at once with ``BrokerUnavailable``: their entries
        may or may not have reached the broker, and are published again."""
        with self._lock:
            thread, target, handoff = self._thread, self._target, self._handoff
            self._thread = self._target = self._handoff = None
        if thread is None or target is None or handoff is None:
            return
        loop = handoff.loop
        try:
            handoff.shut(target.close, target.timeout + MARGIN)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            handoff.fail_queued(BrokerUnavailable(CLOSED))
            loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, work: Any) -> Any:
        """Run ``work(target)``, a coroutine, on the loop thread and wait for its result."""
        handoff, target = self._started()
        return handoff.call(lambda: work(target), target.timeout + MARGIN)

    def _started(self) -> tuple[Handoff, AsyncRabbitPublisher]:
        with self._lock:
            if self._handoff is None or self._target is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="docoutbox-rabbitmq-loop", daemon=True
                )
                thread.start()
                # A publisher of its own per loop: its connection and lock belong to it.
                self._target = AsyncRabbitPublisher(*self._args, **self._options)
                self._thread, self._handoff = thread, Handoff(loop)
            return self._handoff, self._target
