"""The threaded RabbitMQ publisher's hand-off to its loop thread
(:mod:`docoutbox_rabbitmq.handoff`): calls queued while the loop is busy share one
wake-up and start in the order they were queued; a caller that stops waiting gets
``BrokerUnavailable`` and its call never starts; calls queued when the loop stops fail.
No broker: a loop thread of the test's own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from docoutbox.errors import BrokerUnavailable
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
