"""A Kafka consumer builds what handles a poll's records once, not for every poll: its
receive options and receiver are kept, and built again only after a setting changed.
Each poll's rejected records are still kept with their own values."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from docoutbox import AggregateStore, AsyncAggregateStore, InboxPolicy, StoreConfig
from docoutbox.codec import encode_entry
from docoutbox.receive import NO_RETRY, Action, Verdict
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend, MemoryDeadLetters
from docoutbox_kafka import KafkaConsumer
from docoutbox_kafka import aio as kafka_aio
from docoutbox_kafka import consumer as kafka_sync
from tests.support import loopless
from tests.support.consumers import Record, counting, refusing

SETTINGS = {"bootstrap.servers": "127.0.0.1:1"}
EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))


def record(offset: int, seq: int) -> Any:
    return Record(offset, encode_entry(make_entry("p1", seq, id=f"m{seq}")))


def sync_consumer(letters: MemoryDeadLetters, verdicts: list[Verdict]) -> KafkaConsumer[Ledger]:
    return KafkaConsumer(
        SETTINGS,
        "t",
        "g",
        AggregateStore(MemoryBackend(), Ledger, EXACT),
        ledger_handlers,
        aggregate_id_of=by_source,
        creates={"Event"},
        retry=NO_RETRY,
        dead_letters=letters,
        on_verdict=lambda verdict, _: verdicts.append(verdict),
        sleep=lambda _: None,
    )


def test_the_sync_consumer_builds_its_receiver_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built = counting(monkeypatch, kafka_sync, "Receiver")
    verdicts: list[Verdict] = []
    worker = sync_consumer(MemoryDeadLetters(), verdicts)
    for offset in range(3):
        worker._handle(None, [record(offset, offset + 1)])  # type: ignore[arg-type]
    assert built == [1]
    assert [v.action for v in verdicts] == [Action.ACK] * 3


def test_a_changed_setting_is_used_from_the_next_poll_and_each_reject_keeps_its_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = counting(monkeypatch, kafka_sync, "Receiver")
    letters, verdicts = MemoryDeadLetters(), []
    worker = sync_consumer(letters, verdicts)
    records = [record(offset, offset + 1) for offset in range(3)]
    worker._handle(None, records[:1])
    worker.handler = refusing
    worker._handle(None, records[1:2])
    worker._handle(None, records[2:])
    assert built == [1, 1]
    assert [v.action for v in verdicts] == [Action.ACK, Action.REJECT, Action.REJECT]
    kept = {key: letter["body"] for key, letter in letters.entries.items()}
    assert kept == {"m2": records[1].value().decode(), "m3": records[2].value().decode()}
    worker.create, worker.creates = False, frozenset()
    worker.handler = ledger_handlers
    built.clear()
    worker._handle(None, [Record(3, encode_entry(make_entry("p2", 1)))])  # type: ignore[arg-type]
    assert built == [1] and verdicts[-1].action is Action.REJECT  # NotFound: no create


def test_the_async_consumer_builds_its_receiver_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built = counting(monkeypatch, kafka_aio, "AsyncReceiver")
    verdicts: list[Verdict] = []

    async def nap(_: float) -> None:
        return None

    worker = kafka_aio.AsyncKafkaConsumer(
        SETTINGS,
        "t",
        "g",
        AsyncAggregateStore(AsyncMemoryBackend(), Ledger, EXACT),
        ledger_handlers,
        aggregate_id_of=by_source,
        creates={"Event"},
        retry=NO_RETRY,
        dead_letters=MemoryDeadLetters(),
        on_verdict=lambda verdict, _: verdicts.append(verdict),
        sleep=nap,
    )
    for offset in range(3):
        loopless.run(worker._handle(None, [record(offset, offset + 1)]))  # type: ignore[arg-type]
    assert built == [1]
    assert [v.action for v in verdicts] == [Action.ACK] * 3
