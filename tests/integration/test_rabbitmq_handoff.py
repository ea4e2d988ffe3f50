"""The threaded RabbitMQ publisher's hand-off to its loop thread
(:mod:`docoutbox_rabbitmq.handoff`): calls queued while the loop is busy share one
wake-up and start in the order they were queued; a caller that stops waiting gets
``BrokerUnavailable`` and its call never starts; calls queued when the loop stops fail.
No broker: a loop thread of the test's own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from docoutbox.errors import BrokerUnavailable
from docoutbox_rabbitmq import pipelined
from docoutbox_rabbitmq.handoff import Handoff


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def busy(loop: asyncio.AbstractEventLoop) -> threading.Event:
    """Hold ``loop`` in a callback until the returned event is set."""
    release, held = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(30)

    loop.call_soon_threadsafe(hold)
    assert held.wait(30)
    return release


def test_calls_queued_while_the_loop_is_busy_share_one_wake_up_and_keep_their_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    handoff = Handoff(loop)
    started: list[int] = []

    def work(n: int) -> asyncio.Future[int]:
        async def run() -> int:
            started.append(n)
            await asyncio.sleep(0)
            return n * 10

        return run()  # type: ignore[return-value]

    release = busy(loop)
    replies = [handoff.submit(lambda n=n: work(n)) for n in range(5)]  # type: ignore[misc]
    assert handoff.wakeups == 1
    release.set()
    assert [reply.wait(30) for reply in replies] == [0, 10, 20, 30, 40]
    assert started == [0, 1, 2, 3, 4]
    assert handoff.call(lambda: work(7), 30) == 70  # type: ignore[arg-type,return-value]
    assert handoff.wakeups == 2


def test_a_caller_that_stops_waiting_fails_and_its_queued_call_never_starts(
    loop: asyncio.AbstractEventLoop,
) -> None:
    handoff = Handoff(loop)
    started: list[str] = []

    async def run() -> str:
        started.append("late")
        return "sent"

    release = busy(loop)
    try:
        with pytest.raises(BrokerUnavailable, match="no answer within"):
            handoff.call(run, 0.01)
    finally:
        release.set()
    assert handoff.call(lambda: asyncio.sleep(0), 30) is None  # what was queued has run
    assert started == []


def test_an_error_of_the_call_is_raised_to_its_caller_alone(
    loop: asyncio.AbstractEventLoop,
) -> None:
    handoff = Handoff(loop)

    async def refused() -> None:
        raise BrokerUnavailable("refused")

    def unstartable() -> Any:
        raise TypeError("not a coroutine")

    release = busy(loop)
    failing, starting = handoff.submit(unstartable), handoff.submit(refused)
    after = handoff.submit(lambda: asyncio.sleep(0, "after"))
    release.set()
    with pytest.raises(TypeError, match="not a coroutine"):
        failing.wait(30)
    with pytest.raises(BrokerUnavailable, match="refused"):
        starting.wait(30)
    assert after.wait(30) == "after"


def test_calls_queued_when_the_loop_stops_fail(loop: asyncio.AbstractEventLoop) -> None:
    handoff = Handoff(loop)
    release = busy(loop)
    reply = handoff.submit(lambda: asyncio.sleep(0))
    handoff.fail_queued(BrokerUnavailable("closed"))
    release.set()
    with pytest.raises(BrokerUnavailable, match="closed"):
        reply.wait(30)


class _Unconfirmed:
    """An async publisher whose rounds wait forever for their confirms, and which opens
    a connection again for any call made after :meth:`close`."""

    timeout = 30.0

    def __init__(self, *args: Any, **options: Any) -> None:
        self.opened = 1
        self.closed = 0
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def publish_many(self, entries: list[Any]) -> list[Exception | None]:
        self.calls += 1
        if self.gate is None:
            self.gate = asyncio.Event()
        await self.gate.wait()  # as a round waiting for the connection's lock
        if self.closed:
            self.opened += 1  # as AsyncRabbitPublisher reconnects after close
        await asyncio.Event().wait()  # its confirms never come
        return [None] * len(entries)

    async def close(self) -> None:
        self.closed += 1
        if self.gate is not None:
            self.gate.set()  # the lock is free again


def test_closing_the_threaded_publisher_ends_the_calls_in_flight_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds still awaiting their confirms when the publisher closes fail at once with
    ``BrokerUnavailable``; none goes on to open a connection on the closed publisher."""
    monkeypatch.setattr(pipelined, "AsyncRabbitPublisher", _Unconfirmed)
    publisher = pipelined.PipelinedRabbitPublisher("amqp://unused", "ex")
    outcomes: list[BaseException | None] = []
    entered = threading.Barrier(5)

    def work() -> None:
        entered.wait(30)
        try:
            publisher.publish_many(["entry"])  # type: ignore[list-item]
        except BrokerUnavailable as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    entered.wait(30)
    target = publisher._started()[1]
    deadline = time.monotonic() + 30
    while target.calls < 4 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)  # every round in flight
    started = time.monotonic()
    publisher.close()
    for worker in workers:
        worker.join(10)
    assert time.monotonic() - started < 5
    assert len(outcomes) == 4 and all(isinstance(o, BrokerUnavailable) for o in outcomes)
    assert (target.opened, target.closed) == (1, 1)  # type: ignore[attr-defined]


def test_a_call_made_while_the_handoff_shuts_fails_and_never_starts(
    loop: asyncio.AbstractEventLoop,
) -> None:
    handoff = Handoff(loop)
    closing = threading.Event()
    started: list[str] = []
    results: list[Any] = []

    async def last() -> str:
        closing.set()
        await asyncio.sleep(0.5)  # what the calls used is being closed
        return "closed"

    async def later() -> None:
        started.append("later")

    shutting = threading.Thread(target=lambda: results.append(handoff.shut(last, 10)))
    shutting.start()
    assert closing.wait(10)
    with pytest.raises(BrokerUnavailable, match="closed"):
        handoff.call(later, 10)
    shutting.join(10)
    assert results == ["closed"] and started == []
