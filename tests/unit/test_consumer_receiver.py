"""A RabbitMQ consumer builds what handles a delivery once, not for every delivery: its
receive options and receiver are kept, and built again only after a setting changed. Each
rejected delivery still keeps its own body in the dead letters."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from docoutbox import AggregateStore, AsyncAggregateStore, InboxPolicy, StoreConfig
from docoutbox.codec import encode_entry
from docoutbox.receive import NO_RETRY, Action
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend, MemoryDeadLetters
from docoutbox_rabbitmq import RabbitConsumer
from docoutbox_rabbitmq import aio as rabbit_aio
from docoutbox_rabbitmq import consumer as rabbit_sync
from tests.support import loopless
from tests.support.consumers import counting, refusing

URL = "amqp://guest:guest@127.0.0.1:5672/"
EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))


def sync_consumer(letters: MemoryDeadLetters | None = None) -> RabbitConsumer[Ledger]:
    store = AggregateStore(MemoryBackend(), Ledger, EXACT)
    return RabbitConsumer(
        URL,
        "q",
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        creates={"Event"},
        retry=NO_RETRY,
        dead_letters=letters,
    )


def async_consumer(letters: MemoryDeadLetters | None = None) -> Any:
    store = AsyncAggregateStore(AsyncMemoryBackend(), Ledger, EXACT)
    return rabbit_aio.AsyncRabbitConsumer(
        URL,
        "q",
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        creates={"Event"},
        retry=NO_RETRY,
        dead_letters=letters,
    )


def test_the_sync_consumer_builds_its_receiver_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built = counting(monkeypatch, rabbit_sync, "Receiver")
    worker = sync_consumer()
    for seq in (1, 2, 3):
        assert worker.decide(encode_entry(make_entry("p1", seq))).action is Action.ACK
    assert built == [1]


def test_the_async_consumer_builds_its_receiver_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built = counting(monkeypatch, rabbit_aio, "AsyncReceiver")
    worker = async_consumer()
    for seq in (1, 2, 3):
        verdict = loopless.run(worker.decide(encode_entry(make_entry("p1", seq))))
        assert verdict.action is Action.ACK
    assert built == [1]


def test_a_changed_setting_is_used_from_the_next_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    built = counting(monkeypatch, rabbit_aio, "AsyncReceiver")
    worker = async_consumer()
    first = loopless.run(worker.decide(encode_entry(make_entry("p1", 1))))
    assert first.action is Action.ACK
    worker.handler = refusing
    refused = loopless.run(worker.decide(encode_entry(make_entry("p1", 2))))
    assert refused.action is Action.REJECT
    assert built == [1, 1]
    sync = sync_consumer()
    assert sync.decide(encode_entry(make_entry("p1", 1))).action is Action.ACK
    sync.create, sync.creates = False, frozenset()
    assert sync.decide(encode_entry(make_entry("p2", 1))).action is Action.REJECT  # NotFound


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_each_rejected_delivery_keeps_its_own_body(shell: str) -> None:
    letters = MemoryDeadLetters()
    worker: Any = sync_consumer(letters) if shell == "sync" else async_consumer(letters)
    worker.handler = refusing
    bodies = [encode_entry(make_entry("p1", seq, id=f"m{seq}")) for seq in (1, 2)]
    for body in bodies:
        decided = worker.decide(body)
        verdict = decided if shell == "sync" else loopless.run(decided)
        assert (verdict.action, verdict.kept) == (Action.REJECT, True)
    kept = {key: letter["body"] for key, letter in letters.entries.items()}
    assert kept == {"m1": bodies[0].decode(), "m2": bodies[1].decode()}
