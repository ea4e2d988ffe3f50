"""Pure lease decisions: which partitions an instance keeps, gives up and tries to take.

Several dispatcher instances share the partitions of one collection. Each one heartbeats
a membership record, renews the leases it holds, and, from one :class:`LeaseView`, plans
its next step with :func:`plan_leases`:

- live instances are itself and those that renewed a member record or a lease lately
  (the keeper counts one live while it misses at most one heartbeat in a row);
- each one is owed ``floor(P / live)`` partitions and may hold ``ceil(P / live)``
  (:func:`shares`), so a settled group splits 4 partitions over 3 instances 2/1/1 and 16
  over 3 6/5/5, as Azure's change feed processor does;
- it keeps up to ``ceil`` of the leases it holds and releases the surplus;
- it acquires free or expired partitions up to ``floor``, then up to ``ceil``: expired
  leases (a crashed holder's) at once, so that a take-over is quick; absent ones
  (released, or never used) only with what the others still need to reach their
  ``floor`` left over, so that a lease handed over goes to the short instance it was
  released for, not back;
- with no free partition left while some instance is below its ``floor``, the most
  loaded instance above ``floor`` (ties: the greatest owner name, so every instance
  names the same one from the same view) hands one lease over: one per heartbeat, and
  the needy one acquires it once it is free. A steal is a hand-over, not an overwrite,
  so the partition is never worked on by two instances at once (the work inside it
  finishes first, see :class:`~docoutbox.dispatch.drivers.ownership.LeaseKeeper`).

A group where every instance holds ``floor`` or ``ceil`` and nothing is free is settled:
nobody is short, so no lease moves (no thrashing). Each hand-over moves a lease from an
instance above ``floor`` to one below it, so the group settles in a bounded number of
moves. Race losers simply do not get the partition; the next heartbeat plans again.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from docoutbox.errors import InvalidConfig
from docoutbox.ports.dispatch import LeaseView
from docoutbox.retry import check_seconds

#: The longest lease a dispatcher takes, in seconds (a day): its TTL is the failover
#: time, and expiry instants must stay representable.
MAX_LEASE_TTL = 86_400.0


@dataclass(frozen=True)
class LeaseTiming:
    """How long a lease lasts, how often it is renewed, and the safety margin.

    An instance stops touching a partition ``margin`` seconds before its lease would
    expire without a renewal, so that two instances never work on one partition at once
    (assuming clocks differ by less than ``margin``).
    """

    ttl: float = 10.0
    interval: float | None = None  # default ttl / 4
    margin: float | None = None  # default ttl / 4

    def __post_init__(self) -> None:
        if check_seconds("lease ttl", self.ttl, positive=True) > MAX_LEASE_TTL:
            raise InvalidConfig(f"lease ttl must be at most {MAX_LEASE_TTL:g} s, got {self.ttl!r}")
        if self.interval is not None:
            check_seconds("lease interval", self.interval, positive=True)
        if self.margin is not None:
            check_seconds("lease margin", self.margin)
        if self.heartbeat + self.safety >= self.ttl:
            raise InvalidConfig("lease interval + margin must be shorter than the ttl")

    @property
    def heartbeat(self) -> float:
        return self.interval if self.interval is not None else self.ttl / 4

    @property
    def safety(self) -> float:
        return self.margin if self.margin is not None else self.ttl / 4

    def valid_until(self, renewed_at: float) -> float:
        """The monotonic time after which a lease renewed at ``renewed_at`` is not used."""
        return renewed_at + self.ttl - self.safety


@dataclass(frozen=True)
class LeasePlan:
    """One heartbeat's decisions, as partition numbers."""

    keep: tuple[int, ...]
    release: tuple[int, ...]
    acquire: tuple[int, ...]
    #: Partitions held locally that the view no longer shows as ours.
    lost: tuple[int, ...]
    #: The most this instance may hold (``ceil(P / live)``): below it, a lease expiring
    #: elsewhere is worth an early look.
    share: int = 0
    #: When the first lease held by another instance expires (a takeover chance).
    next_expiry: datetime | None = None


def fair_share(partitions: int, live: int) -> int:
    """How many partitions one of ``live`` instances may hold."""
    return math.ceil(partitions / max(1, live))


def shares(partitions: int, live: int) -> tuple[int, int]:
    """``(floor, ceil)`` of ``partitions / live``: every instance of a settled group holds
    one or the other."""
    return partitions // max(1, live), fair_share(partitions, live)


def victim(counts: Mapping[str, int]) -> str | None:
    """The instance a short one takes a lease from: the most loaded (ties: the greatest
    name), the same for every instance that reads the same view."""
    return max(counts, key=lambda owner: (counts[owner], owner)) if counts else None


def live_owners(view: LeaseView, me: str, fresh_after: datetime) -> set[str]:
    """The instances that renewed a member record or a lease lately: one of their
    expiries is after ``fresh_after``."""
    owners = {owner for owner, expires in view.members.items() if expires > fresh_after}
    owners |= {owner for owner, expires in view.leases.values() if expires > fresh_after}
    owners.add(me)
    return owners


def dead_members(view: LeaseView, now: datetime, ttl: float) -> list[str]:
    """Members whose heartbeat expired more than ``ttl`` seconds before ``now``.

    A live instance refreshes its record every heartbeat; one expired that long ago
    belongs to an instance that died without leaving, and its record can go.
    """
    cutoff = now - timedelta(seconds=ttl)
    return sorted(owner for owner, expires in view.members.items() if expires < cutoff)


def plan_leases(
    view: LeaseView,
    *,
    me: str,
    partitions: int,
    now: datetime,
    held: Collection[int],
    rng: random.Random,
    fresh_after: datetime | None = None,
) -> LeasePlan:
    """Decide what to keep, release and acquire; see the module docstring.

    ``fresh_after`` (default ``now``): an instance counts as live only if one of its
    expiries is later. An instance renews every heartbeat, each time to ``ttl`` ahead, so
    ``now + ttl - 2.5 heartbeats`` leaves out an instance that missed two heartbeats in a
    row: it died, and its leases, still unexpired, will not be renewed. Left in, it
    lowered every share until its last lease expired, so the partitions of an instance
    that died shortly before it waited that long for a taker.
    """
    live = live_owners(view, me, now if fresh_after is None else max(now, fresh_after))
    counts = dict.fromkeys(live, 0)
    taken: set[int] = set()
    for p, (owner, expires) in view.leases.items():
        if expires > now and 0 <= p < partitions:
            taken.add(p)
            counts[owner] = counts.get(owner, 0) + 1
    mine = sorted(
        p
        for p, (owner, expires) in view.leases.items()
        if owner == me and expires > now and 0 <= p < partitions
    )
    lost = tuple(sorted(set(held) - set(mine)))
    floor, ceil = shares(partitions, len(live))
    keep, release = mine[:ceil], mine[ceil:]
    # Expired leases (a crashed or cut-off holder's) and absent ones (released, or never
    # used), each in random order so that racing instances spread over them.
    expired = [p for p in range(partitions) if p in view.leases and p not in taken]
    absent = [p for p in range(partitions) if p not in view.leases]
    rng.shuffle(expired)
    rng.shuffle(absent)
    short = sum(max(0, floor - n) for owner, n in counts.items() if owner != me and owner in live)
    first = (expired + absent)[: max(0, floor - len(keep))]  # up to floor: anything free
    spare = max(0, len(absent) - len(set(first) & set(absent)) - short)
    rest = [p for p in expired if p not in first] + [p for p in absent if p not in first][:spare]
    acquire = tuple(sorted(first + rest[: max(0, ceil - len(keep) - len(first))]))
    free = expired or absent
    if not free and not release and short and victim(counts) == me and len(keep) > floor:
        keep, release = keep[:-1], keep[-1:]  # hand one over to an instance below floor
    foreign = [e for o, e in view.leases.values() if o != me and e > now]
    return LeasePlan(
        keep=tuple(keep),
        release=tuple(release),
        acquire=acquire,
        lost=lost,
        share=ceil,
        next_expiry=min(foreign) if foreign else None,
    )
