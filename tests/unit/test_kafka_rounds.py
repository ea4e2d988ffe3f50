"""A Kafka publish round counts its delivery reports: whoever waits is woken once, by the
last report or settlement, and each entry keeps its own report."""

from __future__ import annotations

from typing import Any

from docoutbox_kafka import AsyncKafkaPublisher, KafkaPublisher
from docoutbox_kafka.publisher import _Round
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
