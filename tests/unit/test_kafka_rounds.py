"""A Kafka publish round counts its delivery reports: whoever waits is woken once, by the
last report or settlement, and each entry keeps its own report. Each record is built once
and produced in order; a full local queue resumes at the record it refused, and a record
``produce`` refuses fails its own entry only."""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from benchmarks.ledger import make_entry
from docoutbox.errors import BrokerUnavailable, PermanentPublishError
from docoutbox_kafka import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_kafka import publisher as publisher_module
from docoutbox_kafka.publisher import _Round, _Sending
from tests.support import loopless

SETTINGS = {"bootstrap.servers": "127.0.0.1:1"}


def test_the_last_report_wakes_the_waiter_once() -> None:
    woken: list[int] = []
    reports = _Round(3, lambda: woken.append(1))
    failure: Any = object()
    reports.report(2, None, None)
    reports.settled()  # a record produce refused: no report will come
    assert woken == []
    reports.report(0, failure, None)
    assert woken == [1]
    assert reports.reported == [True, False, True]
    assert reports.errors == [failure, None, None]


def test_an_empty_round_sends_nothing_and_waits_for_nothing() -> None:
    publisher = KafkaPublisher(SETTINGS, "t")
    assert publisher.publish_many([]) == []
    assert publisher._producer is None  # no producer was even created
    asynchronous = AsyncKafkaPublisher(SETTINGS, "t")
    assert loopless.run(asynchronous.publish_many([])) == []
    assert asynchronous.sync._producer is None


class FakeProducer:
    """Takes records as confluent-kafka's producer does; ``refuse`` maps a call's index to
    the exception ``produce`` raises that time (once)."""

    def __init__(self, refuse: dict[int, Exception] | None = None) -> None:
        self.refuse = dict(refuse or {})
        self.calls = 0
        self.keys: list[bytes] = []
        self.reports: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, **options: Any) -> None:
        refused = self.refuse.pop(self.calls, None)
        self.calls += 1
        if refused is not None:
            raise refused
        self.keys.append(key)
        self.reports.append(options["on_delivery"])


def sending(
    producer: FakeProducer, count: int, woken: list[int], timeout: float = 30.0
) -> _Sending:
    publisher = KafkaPublisher(SETTINGS, "t")
    publisher._timeout = timeout
    entries = [make_entry(f"agg-{index}") for index in range(count)]
    return _Sending(publisher, cast(Any, producer), entries, lambda: woken.append(1))


def test_a_full_local_queue_resumes_at_the_record_it_refused_built_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = 0
    real = publisher_module.record_for

    def counting(*args: Any) -> Any:
        nonlocal built
        built += 1
        return real(*args)

    monkeypatch.setattr(publisher_module, "record_for", counting)
    producer = FakeProducer({1: BufferError("full")})
    woken: list[int] = []
    round_ = sending(producer, 3, woken)
    assert round_.produce() is False  # the caller waits for room, then calls again
    assert producer.keys == [b"agg-0"]
    assert round_.produce() is True
    assert producer.keys == [b"agg-0", b"agg-1", b"agg-2"]
    assert built == 3  # each record built once, not once per attempt
    for report in producer.reports:
        report(None, None)
    assert woken == [1]
    assert round_.outcomes() == [None, None, None]


def test_a_record_produce_refuses_fails_its_own_entry_only() -> None:
    too_large = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
    producer = FakeProducer({1: too_large})
    woken: list[int] = []
    round_ = sending(producer, 3, woken)
    assert round_.produce() is True
    assert producer.keys == [b"agg-0", b"agg-2"]  # the next record still goes out
    producer.reports[0](None, None)
    assert woken == []
    producer.reports[1](None, None)
    assert woken == [1]  # the refused record was settled: the last report wakes
    first, refused, last = round_.outcomes()
    assert first is None and last is None
    assert isinstance(refused, PermanentPublishError)
    assert "publish entry e-agg-1-1-" in str(refused) and "to topic 't'" in str(refused)


def test_a_queue_still_full_at_the_deadline_and_a_missing_report_are_unavailable() -> None:
    producer = FakeProducer({0: BufferError("full")})
    woken: list[int] = []
    round_ = sending(producer, 2, woken, timeout=0.0)
    assert round_.produce() is True  # past the deadline: the entry fails, the round goes on
    assert producer.keys == [b"agg-1"]
    full, unreported = round_.outcomes()  # agg-1 never reported
    assert isinstance(full, BrokerUnavailable) and "local queue is full" in str(full)
    assert isinstance(unreported, BrokerUnavailable) and "no delivery report" in str(unreported)
    assert woken == []


def test_a_failed_report_is_that_entry_s_error() -> None:
    producer = FakeProducer()
    woken: list[int] = []
    round_ = sending(producer, 2, woken)
    round_.produce()
    producer.reports[0](KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), None)
    producer.reports[1](None, None)
    failed, delivered = round_.outcomes()
    assert isinstance(failed, BrokerUnavailable) and "_MSG_TIMED_OUT" in str(failed)
    assert delivered is None


def test_linger_is_zero_unless_configured() -> None:
    """A lone ``publish`` waits for its report, so the publisher does not linger unless
    told to (librdkafka's own default is 5 ms); a configured value is kept."""
    assert KafkaPublisher(SETTINGS, "t")._settings["linger.ms"] == 0
    assert KafkaPublisher({**SETTINGS, "linger.ms": 5}, "t")._settings["linger.ms"] == 5
