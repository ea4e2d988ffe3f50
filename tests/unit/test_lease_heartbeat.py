"""The lease heartbeat keeps its rate while the lease table is slow: heartbeats start every
``heartbeat`` seconds from the previous start (not its end), renewals go before the
membership record, and a renewal landing late is logged.

On a loaded machine a heartbeat's requests can take a sizeable share of the TTL (the
local Cosmos DB server answered renewals up to 1.9 s late at a load of 11 on 2 cores);
counting the wait from the end of a slow heartbeat added that time again to the next
renewal, and a slow membership write delayed the renewals behind it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Collection
from datetime import UTC, datetime, timedelta

import pytest

from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.errors import StoreError
from docoutbox.ports.dispatch import LeaseView
from docoutbox.testing.dispatch import MemoryLeaseTable

NOW = datetime(2030, 1, 1, tzinfo=UTC)
TIMING = LeaseTiming(ttl=2.0)  # heartbeat and margin 0.5 s


class SlowTable(MemoryLeaseTable):
    """A memory lease table whose every request takes ``delay`` seconds of the clock."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.t = 0.0
        self.delay = delay
        self.calls: list[str] = []

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    def _took(self, name: str) -> None:
        self.calls.append(name)
        self.t += self.delay

    def read(self) -> LeaseView:
        self._took("read")
        return super().read()

    def join(self, owner: str, expires_at: datetime) -> None:
        self._took("join")
        super().join(owner, expires_at)

    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        self._took("renew")
        super().renew(partitions, owner, expires_at)

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        self._took("acquire")
        return super().acquire(partition, owner, now, expires_at)


def keeper(table: SlowTable) -> LeaseKeeper:
    return LeaseKeeper(
        table,
        partitions=2,
        owner="a",
        timing=TIMING,
        clock=table.wall,
        monotonic=lambda: table.t,
        rng=random.Random(0),
    )


def test_heartbeats_start_at_a_fixed_rate_however_long_one_takes() -> None:
    table = SlowTable(delay=0.05)
    a = keeper(table)
    a.tick()  # read, join, two acquisitions: 0.2 s
    assert a.owned() == frozenset({0, 1})
    assert table.t == pytest.approx(0.2)
    assert a.next_beat() == pytest.approx(TIMING.heartbeat - 0.2)
    table.t = 0.5
    a.tick()  # renew, join, read: 0.15 s
    assert a.next_beat() == pytest.approx(1.0 - 0.65)
    table.t = 1.4  # past the next start: due at once
    assert a.next_beat() == 0.0


def test_renewals_go_before_the_membership_record() -> None:
    table = SlowTable(delay=0.01)
    a = keeper(table)
    a.tick()
    table.calls.clear()
    a.tick()
    assert table.calls == ["renew", "join", "read"]


def test_a_renewal_landing_late_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    table = SlowTable(delay=0.01)
    a = keeper(table)
    a.tick()
    table.t = TIMING.heartbeat + 0.05  # on time: the renewal lands 0.06 s behind
    with caplog.at_level(logging.WARNING, logger="docoutbox.leases"):
        a.tick()
    assert "lease_renewal_late" not in caplog.text
    table.t = 2 * TIMING.heartbeat + 0.3  # 0.25 s behind its start, plus a 0.01 s renewal
    with caplog.at_level(logging.WARNING, logger="docoutbox.leases"):
        a.tick()
    assert "lease_renewal_late owner=a late=0.250 renew=0.010" in caplog.text
    assert a.owned() == frozenset({0, 1})  # late, not lapsed: still in use


def test_an_instance_short_of_its_share_looks_again_as_a_dead_holder_s_lease_expires() -> None:
    """The takeover after a crash waits for the lease to expire, and not a heartbeat more:
    the survivor's next heartbeat is 10 ms after the first foreign lease expires."""
    table = SlowTable(delay=0.0)
    a = keeper(table)
    a.tick()  # a takes both partitions until t = 2.0, then dies (no more heartbeats)
    b = LeaseKeeper(
        table,
        partitions=2,
        owner="b",
        timing=TIMING,
        clock=table.wall,
        monotonic=lambda: table.t,
        rng=random.Random(1),
    )
    table.t = 1.8
    b.tick()
    assert b.owned() == frozenset()
    assert b.next_beat() == pytest.approx(0.21)  # not a whole heartbeat (0.5 s)
    table.t = 2.01
    b.tick()
    assert b.owned() == frozenset({0, 1})


class FailingTable(SlowTable):
    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        self._took("renew")
        raise StoreError("the lease table is unreachable")


def test_a_failed_heartbeat_waits_for_the_next_one_instead_of_retrying_at_once() -> None:
    table = FailingTable(delay=0.05)
    a = keeper(table)
    a.tick()
    table.t = TIMING.heartbeat
    with pytest.raises(StoreError):
        a.tick()
    assert a.next_beat() == pytest.approx(TIMING.heartbeat - 0.05)
