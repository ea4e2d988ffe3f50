"""Publish rounds on asyncio: a pipelining publisher gets the whole round, a plain one
overlapping publishes (an event loop: integration tier)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from docoutbox.dispatch.drivers.aio import in_thread
from docoutbox.dispatch.drivers.operations import AsyncPorts
from docoutbox.dispatch.engine.loop import PublishRound
from docoutbox.errors import PublishError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import AsyncPipelinedPublisher
from docoutbox.testing import AsyncMemoryBackend
from docoutbox.testing.publisher import MemoryDeadLetters
from tests.unit.test_publish_rounds import message


class AsyncPipelined:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def publish(self, entry: OutboxMessage) -> None:
        raise AssertionError("a round goes to publish_many")

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        self.calls.append([e.id for e in entries])
        return [None] * len(entries)


class Overlapping:
    """An async publisher without publish_many: counts the publishes in flight at once."""

    def __init__(self) -> None:
        self.now = self.most = 0

    async def publish(self, entry: OutboxMessage) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        await asyncio.sleep(0.001)
        self.now -= 1
        if entry.aggregate_id == "b":
            raise PublishError("nacked")


def test_async_rounds_use_publish_many_or_overlap_plain_publishes() -> None:
    def aports(publisher: Any) -> AsyncPorts:
        return AsyncPorts(AsyncMemoryBackend(), publisher, in_thread(MemoryDeadLetters()))

    pipelined = AsyncPipelined()
    assert isinstance(pipelined, AsyncPipelinedPublisher)
    round_ = PublishRound(tuple(message(a) for a in "abc"))
    assert asyncio.run(aports(pipelined).perform(round_)) == [None, None, None]
    assert pipelined.calls == [["a-1", "b-1", "c-1"]]

    plain = Overlapping()
    many = aports(plain)
    assert not many.pipelined
    outcomes = asyncio.run(many.perform(round_))
    assert plain.most == 3
    assert [type(o).__name__ for o in outcomes] == ["NoneType", "PublishError", "NoneType"]
