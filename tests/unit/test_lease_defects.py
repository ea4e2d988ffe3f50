"""Lease defects found in acceptance testing, each pinned by a test that fails without its fix:
mismatched partition counts, heartbeats stuck behind hand-overs, dead members kept forever."""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime, timedelta

import pytest

from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming, dead_members
from docoutbox.dispatch.engine.loop import event_target
from docoutbox.ports.dispatch import LeaseView
from docoutbox.testing.dispatch import MemoryLeaseTable

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_an_event_from_a_partition_out_of_range_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    doc = {"_id": "a", "partition": 9, "outbox": [{"id": "e"}]}
    with caplog.at_level(logging.ERROR, logger="docoutbox.dispatcher"):
        assert event_target(doc, 4) == ("a", 1)
    assert "partition_out_of_range aggregate='a' partition=9 partitions=4" in caplog.text


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    def mono(self) -> float:
        return self.t


def keeper(table: MemoryLeaseTable, owner: str, clock: Clock, timing: LeaseTiming) -> LeaseKeeper:
    return LeaseKeeper(
        table,
        partitions=4,
        owner=owner,
        timing=timing,
        clock=clock.wall,
        monotonic=clock.mono,
        rng=random.Random(owner),
    )


def test_member_records_of_dead_instances_are_removed() -> None:
    table, clock = MemoryLeaseTable(), Clock()
    timing = LeaseTiming(ttl=4, interval=1, margin=1)
    table.join("killed-long-ago", NOW - timedelta(seconds=60))
    table.join("just-expired", NOW - timedelta(seconds=1))
    a = keeper(table, "a", clock, timing)
    a.tick()
    assert sorted(table.members) == ["a", "just-expired"]
    clock.t = 10
    a.tick()
    assert sorted(table.members) == ["a"]


def test_dead_members_are_those_expired_for_over_a_ttl() -> None:
    view = LeaseView({}, {"old": NOW - timedelta(seconds=11), "recent": NOW - timedelta(seconds=9)})
    assert dead_members(view, NOW, ttl=10) == ["old"]
