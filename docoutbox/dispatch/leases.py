"""Pure lease decisions: which partitions an instance keeps, gives up and tries to take.

Several dispatcher instances share the partitions of one collection. Each one heartbeats
a membership record, renews the leases it holds, and, from one :class:`LeaseView`, plans
its next step with :func:`plan_leases`:

- live instances are the unexpired members, the owners of unexpired leases, and itself;
- its fair share is ``ceil(partitions / live)``;
- it keeps up to its share of the leases it holds, releases the surplus, and tries to
  acquire free or expired partitions up to its share.

Race losers simply do not get the partition; the next heartbeat plans again.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from docoutbox.dispatch.ports import LeaseView


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
        if self.ttl <= 0:
            raise ValueError("lease ttl must be positive")
        if self.heartbeat + self.safety >= self.ttl:
            raise ValueError("lease interval + margin must be shorter than the ttl")

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
    #: The fair share this plan aims for.
    share: int = 0
    #: When the first lease held by another instance expires (a takeover chance).
    next_expiry: datetime | None = None


def fair_share(partitions: int, live: int) -> int:
    """How many partitions one of ``live`` instances may hold."""
    return math.ceil(partitions / max(1, live))


def live_owners(view: LeaseView, me: str, now: datetime) -> set[str]:
    owners = {owner for owner, expires in view.members.items() if expires > now}
    owners |= {owner for owner, expires in view.leases.values() if expires > now}
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
) -> LeasePlan:
    """Decide what to keep, release and acquire; see the module docstring."""
    mine = sorted(
        p
        for p, (owner, expires) in view.leases.items()
        if owner == me and expires > now and 0 <= p < partitions
    )
    lost = tuple(sorted(set(held) - set(mine)))
    share = fair_share(partitions, len(live_owners(view, me, now)))
    keep, release = tuple(mine[:share]), tuple(mine[share:])
    taken = {p for p, (_, expires) in view.leases.items() if expires > now}
    free = [p for p in range(partitions) if p not in taken]
    wanted = max(0, share - len(keep))
    acquire = tuple(sorted(rng.sample(free, min(wanted, len(free)))))
    foreign = [e for o, e in view.leases.values() if o != me and e > now]
    return LeasePlan(
        keep=keep,
        release=release,
        acquire=acquire,
        lost=lost,
        share=share,
        next_expiry=min(foreign) if foreign else None,
    )
