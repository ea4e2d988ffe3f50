"""Fair balancing of leases, as Azure's change feed processor does it: every instance ends
with floor(P/N) or ceil(P/N) partitions, a short instance takes a free lease first, else
the most loaded instance hands one over, one at a time, and a settled group stays put."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from docoutbox.dispatch.drivers.ownership import LeaseKeeper
from docoutbox.dispatch.engine.leases import LeaseTiming, plan_leases, shares, victim
from docoutbox.ports.dispatch import LeaseView
from docoutbox.testing.dispatch import MemoryLeaseTable

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(seconds=10)


def view(owners: dict[int, str], members: tuple[str, ...] = ()) -> LeaseView:
    live = set(owners.values()) | set(members)
    return LeaseView({p: (o, LATER) for p, o in owners.items()}, dict.fromkeys(live, LATER))


def plan(v: LeaseView, me: str, partitions: int):  # type: ignore[no-untyped-def]
    mine = tuple(p for p, (o, _) in v.leases.items() if o == me)
    return plan_leases(v, me=me, partitions=partitions, now=NOW, held=mine, rng=random.Random(me))


@pytest.mark.parametrize(
    ("partitions", "live", "expected"), [(4, 3, (1, 2)), (16, 3, (5, 6)), (16, 4, (4, 4))]
)
def test_shares_are_floor_and_ceil(partitions: int, live: int, expected: tuple[int, int]) -> None:
    assert shares(partitions, live) == expected


def test_the_victim_is_the_most_loaded_with_a_tie_broken_by_name() -> None:
    assert victim({"a": 2, "b": 2, "c": 0}) == "b"
    assert victim({"a": 3, "b": 2, "c": 0}) == "a"


def test_with_nothing_free_the_most_loaded_hands_one_over_to_a_short_instance() -> None:
    # 4 ranges over 3 instances, split 2/2/0: c is short of its floor (1).
    v = view({0: "a", 1: "a", 2: "b", 3: "b"}, members=("c",))
    b = plan(v, "b", 4)
    assert b.release == (3,) and b.keep == (2,) and b.acquire == ()
    a = plan(v, "a", 4)  # a is as loaded as b, but b is the one every instance names
    assert a.release == () and a.keep == (0, 1) and a.acquire == ()
    c = plan(v, "c", 4)
    assert c.acquire == () and c.share == 2  # nothing free yet: c waits for b's hand-over


def test_a_handed_over_lease_goes_to_the_short_instance_not_back() -> None:
    v = view({0: "a", 1: "a", 2: "b"}, members=("c",))  # b released 3
    assert plan(v, "b", 4).acquire == ()  # b is at its floor: 3 is c's
    assert plan(v, "a", 4).acquire == () and plan(v, "a", 4).release == ()
    assert plan(v, "c", 4).acquire == (3,)


def test_a_short_instance_takes_a_free_lease_before_anything_is_handed_over() -> None:
    v = view({0: "a", 1: "a", 2: "b"}, members=("c",))
    assert plan(v, "a", 4).release == ()


@pytest.mark.parametrize(
    "owners",
    [
        {0: "a", 1: "a", 2: "b", 3: "c"},
        {p: o for p, o in zip(range(16), "a" * 6 + "b" * 5 + "c" * 5, strict=True)},
        {p: o for p, o in zip(range(16), "a" * 5 + "b" * 6 + "c" * 5, strict=True)},
    ],
)
def test_a_settled_group_moves_nothing(owners: dict[int, str]) -> None:
    v = view(owners)
    partitions = len(owners)
    for me in "abc":
        p = plan(v, me, partitions)
        assert p.release == () and p.acquire == () and p.lost == ()
        assert p.keep == tuple(sorted(q for q, o in owners.items() if o == me))


def test_an_instance_at_its_floor_takes_a_spare_lease_up_to_its_ceiling() -> None:
    # 16 over 3: a holds 6, b 5, c 4 and one is free. c (short) takes it; b may not.
    owners = dict(zip(range(15), "a" * 6 + "b" * 5 + "c" * 4, strict=True))
    v = view(owners)
    assert plan(v, "c", 16).acquire == (15,)
    assert plan(v, "b", 16).acquire == ()
    owners = dict(zip(range(14), "a" * 6 + "b" * 5 + "c" * 3, strict=False))
    # two free, c needs two: nothing to spare for b.
    assert plan(view(owners), "b", 16).acquire == ()
    assert plan(view(owners), "c", 16).acquire == (14, 15)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def wall(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    def mono(self) -> float:
        return self.t


def group(names: str, partitions: int) -> tuple[MemoryLeaseTable, Clock, list[LeaseKeeper]]:
    table, clock = MemoryLeaseTable(), Clock()
    keepers = [
        LeaseKeeper(
            table,
            partitions=partitions,
            owner=name,
            timing=LeaseTiming(ttl=4, interval=1, margin=1),
            clock=clock.wall,
            monotonic=clock.mono,
            rng=random.Random(name),
        )
        for name in names
    ]
    return table, clock, keepers


def heartbeat(clock: Clock, keepers: list[LeaseKeeper], rng: random.Random) -> None:
    clock.t += 1
    for k in rng.sample(keepers, len(keepers)):
        k.tick()


def counts(table: MemoryLeaseTable) -> list[int]:
    return sorted(Counter(owner for owner, _ in table.leases.values()).values(), reverse=True)


@pytest.mark.parametrize(
    ("partitions", "names", "settled"),
    [(4, "abc", [2, 1, 1]), (16, "abc", [6, 5, 5]), (16, "abcde", [4, 3, 3, 3, 3])],
)
@pytest.mark.parametrize("seed", range(5))
def test_keepers_joining_one_by_one_settle_at_floor_or_ceil_and_stay(
    partitions: int, names: str, settled: list[int], seed: int
) -> None:
    rng = random.Random(seed)
    table, clock, keepers = group(names, partitions)
    for joined in range(1, len(keepers) + 1):  # instances start one after another
        for _ in range(3):
            heartbeat(clock, keepers[:joined], rng)
    for _ in range(4 * partitions):
        if counts(table) == settled and sum(counts(table)) == partitions:
            break
        heartbeat(clock, keepers, rng)
    assert counts(table) == settled
    owners = dict(table.leases)
    for _ in range(10):  # settled: no lease changes hands any more
        heartbeat(clock, keepers, rng)
        assert {p: o for p, (o, _) in table.leases.items()} == {
            p: o for p, (o, _) in owners.items()
        }
    # each keeper's view of what it owns agrees with the table, without overlap
    seen: set[int] = set()
    for k in keepers:
        mine = k.owned() or frozenset()
        assert not mine & seen
        seen |= mine
    assert seen == set(range(partitions))


def test_a_hand_over_waits_for_the_work_inside_and_no_lease_is_held_twice() -> None:
    table, clock, (a, b, c) = group("abc", 4)
    rng = random.Random(0)
    for _ in range(4):
        heartbeat(clock, [a, b], rng)
    assert counts(table) == [2, 2]
    busy = sorted(b.owned() or ())[-1]  # the lease b hands over first
    assert b.enter(busy)
    for _ in range(3):
        heartbeat(clock, [a, b, c], rng)
        assert table.leases[busy][0] == "b"  # still b's while its worker is inside
        assert not c.owned() or busy not in (c.owned() or ())
    b.leave(busy)
    for _ in range(3):
        heartbeat(clock, [a, b, c], rng)
    assert counts(table) == [2, 1, 1]
    assert table.leases[busy][0] == "c"


def test_a_crashed_holders_expired_leases_are_taken_at_once_up_to_ceil() -> None:
    """A take-over must not wait for a short instance: expired leases go to anyone below
    ceil (the short one is then served by a hand-over); absent ones stay reserved."""
    past = NOW - timedelta(seconds=1)
    leases = {p: ("a", LATER) for p in range(5)} | {p: ("b", LATER) for p in range(5, 10)}
    leases |= {p: ("dead", past) for p in range(10, 15)}  # 15 is absent
    v = LeaseView(leases, {"a": LATER, "b": LATER, "n": LATER})
    a = plan(v, "a", 16)  # floor 5, ceil 6; n is short by 5
    assert len(a.acquire) == 1 and set(a.acquire) <= set(range(10, 15))
    n = plan(v, "n", 16)
    assert n.acquire == tuple(range(10, 16))  # to floor, then the absent one to ceil
