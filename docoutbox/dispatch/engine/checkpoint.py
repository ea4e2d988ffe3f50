"""How far the checkpoint may advance (invariant I5), and sweeps in progress.

:class:`PositionTracker` keeps the stream's events in arrival order with a completion
check each. The checkpoint may move to the position of the last event of the longest
*completed prefix* (:func:`docoutbox.dispatch.checkpoint_after`): an unfinished event
holds back every later one. :class:`LanedTracker` does the same lane by lane, for a
stream made of independent ones (Cosmos DB feed ranges).

A :class:`Sweep` pages through documents with pending entries; when it replaces a lost
stream position it carries a :class:`Gate`, an entry of the tracker that completes only
once the whole sweep has been dispatched.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import count, islice

from docoutbox.dispatch.engine.flow import checkpoint_after
from docoutbox.model import AggregateId
from docoutbox.ports.dispatch import Position

Done = Callable[[], bool]


#: The longest position a log line shows as it is.
SHOWN_POSITION = 120


def describe_position(position: Position | None) -> str:
    """A position short enough for a log line: as it is when short (a MongoDB resume
    token), else its size, its number of parts (a Cosmos DB continuation per feed range)
    and a hash that tells two positions apart (a Cosmos DB continuation is kilobytes of
    base64)."""
    text = repr(position)
    if len(text) <= SHOWN_POSITION:
        return text
    parts = f"{len(position)} parts, " if isinstance(position, Mapping | list | tuple) else ""
    digest = hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:12]
    return f"<{type(position).__name__}: {parts}{len(text)} chars, sha256 {digest}>"


def always_done() -> bool:
    return True


class PositionTracker:
    """Events awaiting completion, oldest first, and the safe position behind them."""

    def __init__(self, position: Position | None = None) -> None:
        self._events: deque[tuple[Position, Done]] = deque()
        self.safe: Position | None = position
        #: The position after the newest event seen (where to reopen a stream).
        self.latest: Position | None = position

    def __len__(self) -> int:
        return len(self._events)

    def add(self, position: Position, done: Done = always_done) -> None:
        self._events.append((position, done))
        self.latest = position

    def advance(self) -> bool:
        """Drop the completed prefix; True if :attr:`safe` moved."""
        moved = False
        while self._events:
            # Lazily: an unfinished head costs one check, however many events wait.
            count = checkpoint_after(done() for _, done in islice(self._events, 64))
            if count == 0:
                break
            for _ in range(count):
                self.safe, _ = self._events.popleft()
            moved = True
        return moved

    def add_event(self, position: Position, done: Done, lane: Hashable | None) -> None:
        """:meth:`add`, for an event of ``lane`` (one tracker keeps all lanes in order)."""
        self.add(position, done)

    def reset(self, position: Position, gate: Gate) -> None:
        """Restart from ``position``, which becomes safe once ``gate`` is done."""
        self._events.clear()
        self.latest = position
        self._events.append((position, gate.done))


#: How a source combines positions: ``merge(latest, held)`` is ``latest`` with the part
#: of each lane in ``held`` taken from the position ``held`` gives for it.
Merge = Callable[[Position, Mapping[Hashable, Position]], Position]


class LanedTracker(PositionTracker):
    """A tracker for a stream made of independent lanes (a Cosmos DB container's feed
    ranges, each with its own continuation): an unfinished event holds back only the
    later events of its own lane.

    The safe position is ``latest`` with each lane that has unfinished events held at
    the position after its last completed event (or, before any, the position known
    when its first unfinished event came): a lane without unfinished events completed
    every event read from it, so its part of ``latest`` is safe. An event without a lane,
    or a reset's gate, turns the tracker back into one ordered list (as
    :class:`PositionTracker`) until everything in it is done.
    """

    def __init__(self, merge: Merge, position: Position | None = None) -> None:
        super().__init__(position)
        self._merge = merge
        self._arrivals = count()
        #: Per lane: its events awaiting completion (arrival number, position, check).
        self._lanes: dict[Hashable, deque[tuple[int, Position, Done]]] = {}
        #: Per lane with unfinished events: the position its part is held at.
        self._floors: dict[Hashable, Position] = {}

    def __len__(self) -> int:
        return len(self._events) + sum(len(events) for events in self._lanes.values())

    def add_event(self, position: Position, done: Done, lane: Hashable | None) -> None:
        if lane is None or self._events:
            if self._lanes:  # one ordered list again, in arrival order
                waiting = sorted(e for events in self._lanes.values() for e in events)
                self._events.extend((p, d) for _, p, d in waiting)
                self._lanes.clear()
                self._floors.clear()
            self.add(position, done)
            return
        events = self._lanes.setdefault(lane, deque())
        if not events:
            self._floors[lane] = self.latest
        events.append((next(self._arrivals), position, done))
        self.latest = position

    def advance(self) -> bool:
        held = self.safe
        if self._events:
            return super().advance()
        floors: dict[Hashable, Position] = {}
        for lane, events in list(self._lanes.items()):
            while events and events[0][2]():
                _, self._floors[lane], _ = events.popleft()
            if events:
                floors[lane] = self._floors[lane]
            else:
                del self._lanes[lane], self._floors[lane]
        if self.latest is not None:
            self.safe = self._merge(self.latest, floors) if floors else self.latest
        return bool(self.safe != held)

    def reset(self, position: Position, gate: Gate) -> None:
        self._lanes.clear()
        self._floors.clear()
        super().reset(position, gate)


@dataclass
class Gate:
    """Done once its sweep has fetched every page and each requested run completed."""

    finished: bool = False
    pending: list[Done] = field(default_factory=list)

    def add(self, done: Done) -> None:
        self.pending.append(done)

    def done(self) -> bool:
        if not self.finished:
            return False
        self.pending = [d for d in self.pending if not d()]
        return not self.pending


@dataclass
class Sweep:
    """A paged scan of documents with pending entries in ``scope`` (None: all)."""

    scope: frozenset[int] | None
    older_than: datetime | None
    gate: Gate | None = None
    after: AggregateId | None = None
    pages: int = 0
    requested: int = 0

    def covers(self, scope: frozenset[int] | None) -> bool:
        """Whether this sweep, run from its first page, finds every document ``scope``'s
        sweep would (it has no grace, and ``scope`` is within its own)."""
        if self.older_than is not None:
            return False
        return self.scope is None or (scope is not None and scope <= self.scope)
