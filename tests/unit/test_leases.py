"""Pure lease planning, and the lease keeper over the in-memory lease table."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming, fair_share, plan_leases
from docoutbox.errors import InvalidConfig
from docoutbox.ports.dispatch import LeaseView
from docoutbox.testing.dispatch import MemoryLeaseTable

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(seconds=10)
PAST = NOW - timedelta(seconds=1)


def plan(view: LeaseView, me: str = "a", held: tuple[int, ...] = (), partitions: int = 16):
    return plan_leases(view, me=me, partitions=partitions, now=NOW, held=held, rng=random.Random(1))


@pytest.mark.parametrize(
    ("partitions", "live", "share"), [(16, 1, 16), (16, 2, 8), (16, 3, 6), (16, 5, 4), (3, 5, 1)]
)
def test_fair_share_covers_every_partition(partitions: int, live: int, share: int) -> None:
    assert fair_share(partitions, live) == share
    assert share * live >= partitions


def test_a_lone_instance_takes_everything() -> None:
    p = plan(LeaseView({}, {}))
    assert p.acquire == tuple(range(16)) and p.keep == () and p.release == ()


def test_a_holder_releases_surplus_when_another_member_is_live() -> None:
    leases = {p: ("a", LATER) for p in range(16)}
    p = plan(LeaseView(leases, {"a": LATER, "b": LATER}), held=tuple(range(16)))
    assert len(p.keep) == 8 and len(p.release) == 8 and p.acquire == ()
    assert set(p.keep) | set(p.release) == set(range(16))


def test_a_newcomer_takes_only_free_or_expired_partitions() -> None:
    leases = {p: ("a", LATER) for p in range(8)} | {p: ("c", PAST) for p in range(8, 12)}
    p = plan(LeaseView(leases, {"a": LATER}), me="b")
    # live: a and b -> share 8; 8..11 expired and 12..15 free.
    assert p.acquire == tuple(range(8, 16))
    assert p.next_expiry == LATER


def test_expired_members_do_not_count_as_live() -> None:
    leases = {p: ("a", LATER) for p in range(16)}
    p = plan(LeaseView(leases, {"a": LATER, "gone": PAST}), held=tuple(range(16)))
    assert p.release == () and len(p.keep) == 16


def test_partitions_taken_over_are_reported_lost() -> None:
    leases = {0: ("a", LATER), 1: ("b", LATER), 2: ("a", PAST)}
    p = plan(LeaseView(leases, {}), held=(0, 1, 2), partitions=3)
    assert p.lost == (1, 2)
    assert p.keep == (0,)
    assert 2 in p.acquire  # our own expired lease is free again (and must be swept)


def test_timing_rejects_a_margin_that_leaves_no_time() -> None:
    with pytest.raises(ValueError, match="shorter"):
        LeaseTiming(ttl=2, interval=1, margin=1)
    assert LeaseTiming(ttl=8).valid_until(100.0) == 106.0


@pytest.mark.parametrize(
    "timing",
    [
        {"ttl": float("nan")},  # accepted: every comparison with NaN is False
        {"ttl": 1e300},  # accepted, then OverflowError in the keeper's timedelta
        {"ttl": "10"},  # TypeError from a comparison
        {"ttl": True},
        {"ttl": 10, "interval": float("nan")},
        {"ttl": 10, "interval": -1.0},  # a heartbeat loop that never sleeps
        {"ttl": 10, "margin": float("nan")},
    ],
)
def test_timing_refuses_values_it_cannot_keep(timing: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig, match="lease"):
        LeaseTiming(**timing)  # type: ignore[arg-type]


def test_a_day_long_lease_is_kept_and_its_expiry_computed() -> None:
    clock = Clock()
    day = LeaseKeeper(
        MemoryLeaseTable(),
        partitions=2,
        owner="a",
        timing=LeaseTiming(ttl=86_400.0),
        clock=clock.wall,
        monotonic=clock.mono,
    )
    day.tick()
    assert day.owned() == {0, 1}


class Clock:
    """A wall clock and a monotonic clock that move together, by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    def mono(self) -> float:
        return self.t


def keeper(table: MemoryLeaseTable, owner: str, clock: Clock, partitions: int = 16) -> LeaseKeeper:
    return LeaseKeeper(
        table,
        partitions=partitions,
        owner=owner,
        timing=LeaseTiming(ttl=4, interval=1, margin=1),
        clock=clock.wall,
        monotonic=clock.mono,
        rng=random.Random(owner),
    )


def test_two_keepers_split_the_partitions_without_overlap() -> None:
    table, clock = MemoryLeaseTable(), Clock()
    a, b = keeper(table, "a", clock), keeper(table, "b", clock)
    a.tick()
    assert a.owned() == frozenset(range(16))
    assert a.take_acquired() == [frozenset(range(16))]
    b.tick()  # b is live now, but everything is held
    assert b.owned() == frozenset()
    for _ in range(3):
        clock.t += 1
        a.tick()
        b.tick()
        owned_a, owned_b = a.owned(), b.owned()
        assert owned_a is not None and owned_b is not None
        assert not owned_a & owned_b
    assert len(owned_a) == 8 and len(owned_b) == 8
    assert b.take_acquired() == [owned_b]  # b sweeps what it gained


def test_a_crashed_keepers_partitions_move_after_expiry_not_before() -> None:
    table, clock = MemoryLeaseTable(), Clock()
    a, b = keeper(table, "a", clock), keeper(table, "b", clock)
    a.tick()
    b.tick()
    clock.t += 1
    a.tick()
    b.tick()
    held_a = a.owned()
    assert held_a and len(held_a) == 8
    # a crashes: no more ticks. Its leases expire 4 s after its last renewal (t=1).
    clock.t = 4.5
    b.tick()
    assert a.owned() == frozenset()  # a itself stopped trusting them at t=1+4-1
    assert not (b.owned() or frozenset()) & held_a
    clock.t = 5.01
    b.tick()
    assert b.owned() == frozenset(range(16))


def test_an_instance_that_missed_two_heartbeats_no_longer_lowers_the_shares() -> None:
    # b's leases are still unexpired, but it renewed nothing for two heartbeats and more
    # (the keeper's fresh_after is now + ttl - 2.5 heartbeats): it died.
    stale = NOW + timedelta(seconds=1)
    leases = {p: ("a", LATER) for p in range(5)} | {p: ("b", stale) for p in range(5, 10)}
    leases |= {p: ("c", PAST) for p in range(10, 16)}  # c died first: expired
    view = LeaseView(leases, {"a": LATER, "b": stale})
    counted = plan(view, held=tuple(range(5)))
    # a and b live: a may hold 8, so it takes 3 of c's 6 (at random).
    assert len(counted.acquire) == 3 and set(counted.acquire) <= set(range(10, 16))
    fresh = plan_leases(
        view,
        me="a",
        partitions=16,
        now=NOW,
        held=tuple(range(5)),
        rng=random.Random(1),
        fresh_after=NOW + timedelta(seconds=2),
    )
    assert fresh.acquire == tuple(range(10, 16))  # a alone is live: all of c's
    assert fresh.release == () and fresh.keep == tuple(range(5))


def test_a_crashed_keepers_partitions_go_at_expiry_though_another_died_after_it() -> None:
    """Two instances die one heartbeat apart: the first one's partitions are taken when
    its leases expire, not when the second one's do."""
    table, clock = MemoryLeaseTable(), Clock()
    a, b, c = (keeper(table, name, clock) for name in "abc")
    for _ in range(6):
        for k in (a, b, c):
            k.tick()
        clock.t += 1
    a.tick()  # t=6: a's last heartbeat (its leases expire at t=10)
    b.tick()
    c.tick()
    held_a = a.owned()
    assert held_a
    for t in (7, 8, 9):
        clock.t = t
        if t == 7:
            b.tick()  # b's last heartbeat (its leases expire at t=11)
        c.tick()
    clock.t = 10.01
    c.tick()
    assert held_a <= (c.owned() or frozenset())


def test_validity_ends_margin_before_expiry_without_renewal() -> None:
    table, clock = MemoryLeaseTable(), Clock()
    a = keeper(table, "a", clock, partitions=2)
    a.tick()
    clock.t = 2.9
    assert a.valid(0) and a.enter(0)
    a.leave(0)
    clock.t = 3.0  # ttl 4 - margin 1
    assert not a.valid(0)
    assert not a.enter(0)


def test_stop_without_release_keeps_the_leases() -> None:
    table, clock = MemoryLeaseTable(), Clock()
    a = keeper(table, "a", clock, partitions=2)
    a.tick()
    a.stop(release=False)
    assert {owner for owner, _ in table.leases.values()} == {"a"}


def test_a_hand_over_lets_the_work_inside_finish_its_trim() -> None:
    """Surplus handed to a newcomer: the worker inside stays valid until it leaves, so it
    trims what it published and the newcomer has nothing to publish again."""
    table, clock = MemoryLeaseTable(), Clock()
    a = keeper(table, "a", clock, partitions=2)
    a.tick()
    assert a.enter(0)
    assert a.enter(1)
    b = keeper(table, "b", clock, partitions=2)
    b.tick()  # b joins: a holds one partition too many, and both are busy
    a.tick()  # a marks one for release; it stays held while its worker is inside
    releasing = {0, 1} - (a.owned() or frozenset())
    assert len(releasing) == 1
    (partition,) = releasing
    assert not a.enter(partition)  # no new work there
    assert a.valid(partition)  # but the work inside may still publish and trim
    assert table.leases[partition][0] == "a"
    a.leave(partition)
    a.tick()  # idle now: released
    assert partition not in table.leases or table.leases[partition][0] != "a"
    assert not a.valid(partition)
