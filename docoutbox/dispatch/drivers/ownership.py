"""Which partitions this dispatcher instance may touch, right now.

:class:`SoleOwner` owns every partition (a single instance). :class:`LeaseKeeper` holds
partition leases in a :class:`~docoutbox.ports.dispatch.LeaseTable`, renewed by a heartbeat
thread and planned by :func:`docoutbox.dispatch.engine.leases.plan_leases`.

Workers bracket their work on an aggregate with ``enter``/``leave`` and check ``valid``
before every publish and trim. A partition being handed over takes no new work, but the
work inside it finishes (publish *and* trim, so the next owner has nothing to publish
again); it is released only once no worker is inside it. A partition stops being valid
``margin`` seconds before its lease could expire unrenewed.

Every partition acquired is swept, except where the lease table says the acquired
partition resumes from a position stored with its lease (Cosmos DB feed ranges: the
lease carries the range's continuation): there the new owner's stream covers every
pending entry of the partition, provided each holder saved that position only behind
work it did. :meth:`LeaseKeeper.checkpointable` is what the table asks before saving it:
only while the partition has been usable without a break since it was acquired (a
partition that lapsed or was being handed over may have had events passed over).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from docoutbox.dispatch.engine.leases import LeaseTiming, dead_members, plan_leases
from docoutbox.errors import DocOutboxError
from docoutbox.ports.dispatch import (
    LeaseTable,
    LeaseView,
    LocatedLeases,
    PositionedLeases,
    Scope,
)
from docoutbox.store.document import Document, utcnow

log = logging.getLogger("docoutbox.leases")


class SoleOwner:
    """Every partition, always: for a single dispatcher instance.

    Nothing is ever acquired, so nothing triggers a sweep: a single instance relies on
    its checkpoint (and sweeps in full when it has none or cannot resume from it).
    """

    def start(self) -> None:
        return None

    def stop(self, *, release: bool = True) -> None:
        return None

    def owned(self) -> Scope:
        return None

    def enter(self, partition: int) -> bool:
        return True

    def leave(self, partition: int) -> None:
        return None

    def valid(self, partition: int) -> bool:
        return True

    def take_acquired(self) -> list[Scope]:
        return []

    def on_acquired(self, callback: Callable[[], None]) -> None:
        """Nothing is ever acquired: ``callback`` is never called."""
        return None


class LeaseKeeper:
    """Partition leases with heartbeat renewal, fair sharing and safe hand-over."""

    def __init__(
        self,
        table: LeaseTable,
        *,
        partitions: int,
        owner: str,
        timing: LeaseTiming | None = None,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.table = table
        self.partitions = partitions
        #: The table's own document-to-partition mapping, if it has one.
        self._locate = table.locate if isinstance(table, LocatedLeases) else None
        #: Whether a partition just acquired resumes from a position stored with its
        #: lease, if the table can tell.
        self._stored = table.resumes if isinstance(table, PositionedLeases) else None
        self.owner = owner
        self.timing = timing or LeaseTiming()
        self._clock = clock
        self._mono = monotonic
        self._rng = rng or random.Random()
        self._until: dict[int, float] = {}  # held partition -> valid until (monotonic)
        self._releasing: set[int] = set()
        self._busy: Counter[int] = Counter()
        self._gained: set[int] = set()
        #: Held partitions acquired with a stored position, not to be swept.
        self._resumed: set[int] = set()
        self._reported: set[int] = set()
        #: Held partitions that were unusable for a while since they were acquired.
        self._broken: set[int] = set()
        self._cond = threading.Condition()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        #: When the next heartbeat is due (monotonic), counted from the last one's start.
        self._planned = self._mono()
        #: Called when partitions were gained (see :meth:`on_acquired`).
        self._listeners: list[Callable[[], None]] = []
        if isinstance(table, PositionedLeases):
            table.guard_checkpoints(self.checkpointable, self.valid)

    # -- what workers see -------------------------------------------------------------

    def owned(self) -> Scope:
        with self._cond:
            return frozenset(p for p in self._until if self._valid(p))

    def valid(self, partition: int) -> bool:
        with self._cond:
            return self._held(partition)

    def _held(self, partition: int) -> bool:
        """Held and safely before expiry: work under way may publish and trim."""
        until = self._until.get(partition)
        return until is not None and self._mono() < until

    def _valid(self, partition: int) -> bool:
        """Held and not being handed over: new work may start."""
        return self._held(partition) and partition not in self._releasing

    def enter(self, partition: int) -> bool:
        with self._cond:
            if not self._valid(partition):
                return False
            self._busy[partition] += 1
            return True

    def leave(self, partition: int) -> None:
        with self._cond:
            self._busy[partition] -= 1
            if self._busy[partition] <= 0:
                del self._busy[partition]
            self._cond.notify_all()

    def take_acquired(self) -> list[Scope]:
        with self._cond:
            gained, self._gained = self._gained, set()
            resumed, self._reported = self._reported, set()
        return [frozenset(s) for s in (gained, resumed) if s]

    def on_acquired(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the heartbeat's thread) after each heartbeat that left
        something for :meth:`take_acquired`: a dispatcher's loop sleeps until then."""
        self._listeners.append(callback)

    def _announce(self) -> None:
        with self._cond:
            news = bool(self._gained or self._reported)
        if news:
            for callback in self._listeners:
                callback()

    def locator(self) -> Callable[[Document], int] | None:
        """The lease table's document-to-partition mapping (:class:`LocatedLeases`), or
        None: the partition stored on each document."""
        return self._locate

    def resumes(self, scope: Scope) -> bool:
        """Whether every partition of ``scope`` (gained) resumes from the position stored
        with its lease, so that the stream covers it and no sweep is needed."""
        with self._cond:
            return scope is not None and bool(scope) and scope <= self._resumed

    def checkpointable(self, partition: int) -> bool:
        """Whether a position of ``partition`` may be saved with its lease: usable now and
        without a break since it was acquired (no event of it can have been passed over)."""
        with self._cond:
            return self._valid(partition) and partition not in self._broken

    # -- heartbeat --------------------------------------------------------------------

    def start(self) -> None:
        """Take a first share synchronously, then heartbeat on a daemon thread."""
        self._beat()
        self._thread = threading.Thread(target=self._loop, name="docoutbox-leases", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._halt.wait(self.next_beat()):
            self._beat()

    def next_beat(self) -> float:
        """Seconds until the next heartbeat is due (0: at once, it is late)."""
        return max(0.0, self._planned - self._mono())

    def _beat(self) -> None:
        try:
            self.tick()
        except DocOutboxError as exc:
            log.warning("lease_heartbeat_failed owner=%s error=%r", self.owner, exc)

    def tick(self) -> None:
        """One heartbeat: renew, join, read, then hand over surplus and acquire a share;
        then, if that gained partitions (even if it failed after), tell the listeners
        (:meth:`on_acquired`).

        Nothing in a tick waits for workers: a partition handed over while a worker is
        inside it stays held (and renewed) until a later tick finds it idle.

        Rule (renewals on time): heartbeats start every ``heartbeat`` seconds counted from
        the previous one's start on the monotonic clock, not from its end, so the time a
        heartbeat's requests take is not added to the next one's wait; the renewals go
        first, before the membership record. A renewal that lands more than half the
        margin behind its schedule is logged (``lease_renewal_late``): held leases stop
        being used once it is ``ttl - margin - heartbeat`` behind (half the TTL by
        default).
        """
        try:
            self._tick()
        finally:
            self._announce()

    def _tick(self) -> None:
        started, now = self._mono(), self._clock()
        late = max(0.0, started - self._planned)
        self._planned = started + self.timing.heartbeat  # also after a failed heartbeat
        expires = now + timedelta(seconds=self.timing.ttl)
        with self._cond:
            held = set(self._until)
        if held:
            self.table.renew(held, self.owner, expires)
        renewed = self._mono()
        self.table.join(self.owner, expires)
        joined = self._mono()
        view = self.table.read()
        read = self._mono()
        if held and late + renewed - started > self.timing.safety / 2:
            log.warning(
                "lease_renewal_late owner=%s late=%.3f renew=%.3f join=%.3f read=%.3f",
                self.owner,
                late,
                renewed - started,
                joined - renewed,
                read - joined,
            )
        # Live: renewed within the last two and a half heartbeats (see plan_leases).
        fresh = self.timing.ttl - 2.5 * self.timing.heartbeat
        plan = plan_leases(
            view,
            me=self.owner,
            partitions=self.partitions,
            now=now,
            held=held,
            rng=self._rng,
            fresh_after=now + timedelta(seconds=fresh),
        )
        with self._cond:
            for p in plan.lost:
                self._drop(p)
            for p in plan.keep:
                if not self._valid(p):
                    self._gained.add(p)  # unusable for a while: events may have been skipped
                    self._broken.add(p)
                    self._resumed.discard(p)
                    self._reported.discard(p)
                self._releasing.discard(p)
                self._until[p] = self.timing.valid_until(started)
            for p in plan.release:
                self._until[p] = self.timing.valid_until(started)
                self._releasing.add(p)
        if plan.lost:
            log.warning("leases_lost owner=%s partitions=%s", self.owner, list(plan.lost))
        for p in plan.release:
            self._release_if_idle(p)
        self._forget_dead_members(view, now)
        got = sum(self._acquire(p) for p in plan.acquire)
        log.debug(
            "lease_tick owner=%s late=%.3f took=%.3f held=%d got=%d",
            self.owner,
            late,
            self._mono() - started,
            len(held),
            got,
        )
        if plan.next_expiry is not None and len(plan.keep) + got < plan.share:
            # Short of a fair share: look again right when another lease may expire.
            until = (plan.next_expiry - now).total_seconds() + 0.01
            self._planned = started + min(self.timing.heartbeat, max(0.01, until))

    def _forget_dead_members(self, view: LeaseView, now: datetime) -> None:
        """Remove member records expired for over a TTL (instances killed, never back)."""
        for owner in dead_members(view, now, self.timing.ttl):
            if owner != self.owner:
                self.table.leave(owner)
                log.info("lease_member_removed owner=%s member=%s", self.owner, owner)

    def _acquire(self, partition: int) -> bool:
        started, now = self._mono(), self._clock()
        expires = now + timedelta(seconds=self.timing.ttl)
        if self.table.acquire(partition, self.owner, now, expires):
            resumed = self._stored is not None and self._stored(partition)
            with self._cond:
                self._until[partition] = self.timing.valid_until(started)
                self._releasing.discard(partition)
                self._broken.discard(partition)
                if resumed:
                    self._resumed.add(partition)
                    self._reported.add(partition)
                else:
                    self._gained.add(partition)
            log.debug("lease_acquired owner=%s partition=%d", self.owner, partition)
            return True
        return False

    def _release_if_idle(self, partition: int) -> bool:
        with self._cond:
            if self._busy[partition] > 0:
                return False  # still busy: renewed next beat, released once idle
        return self._release_when_idle(partition, timeout=0)

    def _release_when_idle(self, partition: int, timeout: float) -> bool:
        with self._cond:
            if not self._cond.wait_for(lambda: self._busy[partition] <= 0, timeout):
                return False  # still busy: renewed next beat, released once idle
        self.table.release(partition, self.owner)
        with self._cond:
            self._drop(partition)
        log.debug("lease_released owner=%s partition=%d", self.owner, partition)
        return True

    def _drop(self, partition: int) -> None:
        self._until.pop(partition, None)
        self._releasing.discard(partition)
        self._gained.discard(partition)
        self._resumed.discard(partition)
        self._reported.discard(partition)
        self._broken.discard(partition)

    def stop(self, *, release: bool = True) -> None:
        """Stop the heartbeat; with ``release``, give every lease back (workers are done)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        if not release:
            return
        with self._cond:
            held = sorted(self._until)
            self._releasing.update(held)
        try:
            for p in held:
                self._release_when_idle(p, timeout=self.timing.safety)
            self.table.leave(self.owner)
        except DocOutboxError as exc:
            log.warning("lease_release_failed owner=%s error=%r", self.owner, exc)
