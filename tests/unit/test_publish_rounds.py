"""Publish rounds on the ports: a pipelining publisher gets the whole round at once, any
other publisher the entries one at a time (sync) or as concurrent calls (async); every
entry gets its own outcome."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox.dispatch.drivers.aio import in_thread
from docoutbox.dispatch.drivers.operations import AsyncPorts, Ports
from docoutbox.dispatch.engine.loop import PublishRound
from docoutbox.errors import BrokerUnavailable, PublishError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import PipelinedPublisher
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend, MemoryPublisher
from docoutbox.testing.publisher import FailureRule, MemoryDeadLetters

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def message(aggregate: str) -> OutboxMessage:
    return OutboxMessage.parse(
        {
            "id": f"{aggregate}-1",
            "type": "Added",
            "payload": {},
            "created_at": T0,
            "seq": 1,
            "aggregate_id": aggregate,
            "aggregate_type": "Counter",
        }
    )


class Pipelined:
    def __init__(self, reply: Any = None) -> None:
        self.calls: list[list[str]] = []
        self.reply = reply

    def publish(self, entry: OutboxMessage) -> None:
        raise AssertionError("a round goes to publish_many")

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        self.calls.append([e.id for e in entries])
        if self.reply is not None:
            return self.reply  # type: ignore[no-any-return]
        return [PublishError("nacked") if e.aggregate_id == "b" else None for e in entries]


class Plain:
    """A publisher without ``publish_many``: a :class:`MemoryPublisher`'s ``publish``."""

    def __init__(self, fail: FailureRule | None = None) -> None:
        self.memory = MemoryPublisher(fail)

    def publish(self, entry: OutboxMessage) -> None:
        self.memory.publish(entry)

    def ids(self) -> list[str]:
        return self.memory.ids()


def ports(publisher: Any) -> Ports:
    return Ports(MemoryBackend(), publisher, MemoryDeadLetters())


def test_a_pipelining_publisher_is_found_once_and_gets_the_whole_round() -> None:
    publisher = Pipelined()
    assert isinstance(publisher, PipelinedPublisher)
    sync = ports(publisher)
    assert sync.pipelined
    outcomes = sync.perform(PublishRound(tuple(message(a) for a in "abc")))
    assert publisher.calls == [["a-1", "b-1", "c-1"]]
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], PublishError)


def test_a_plain_publisher_gets_the_entries_one_at_a_time_each_with_its_outcome() -> None:
    publisher = Plain(fail=lambda e: PublishError("nacked") if e.aggregate_id == "b" else None)
    sync = ports(publisher)
    assert not sync.pipelined
    outcomes = sync.perform(PublishRound(tuple(message(a) for a in "abc")))
    assert publisher.ids() == ["a-1", "c-1"]
    assert [type(o).__name__ for o in outcomes] == ["NoneType", "PublishError", "NoneType"]


def test_once_the_broker_is_unreachable_the_rest_of_the_round_is_not_sent() -> None:
    publisher = Plain(fail=lambda e: BrokerUnavailable("down") if e.aggregate_id == "b" else None)
    outcomes = ports(publisher).perform(PublishRound(tuple(message(a) for a in "abc")))
    assert publisher.ids() == ["a-1"]
    assert outcomes[0] is None
    assert all(isinstance(o, BrokerUnavailable) for o in outcomes[1:])


@pytest.mark.parametrize("reply", [[None], [None, None, "ok"], "nope", [None, 1, None]])
def test_a_publish_many_reply_of_the_wrong_shape_fails_the_round(reply: Any) -> None:
    with pytest.raises(PublishError, match="one outcome"):
        ports(Pipelined(reply)).perform(PublishRound(tuple(message(a) for a in "abc")))


def test_in_thread_keeps_the_capability_of_the_sync_publisher_it_wraps() -> None:
    backend, dead = AsyncMemoryBackend(), in_thread(MemoryDeadLetters())
    assert AsyncPorts(backend, in_thread(Pipelined()), dead).pipelined
    assert not AsyncPorts(backend, in_thread(Plain()), dead).pipelined
