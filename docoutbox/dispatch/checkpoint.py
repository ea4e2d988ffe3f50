"""How far the checkpoint may advance (invariant I5), and sweeps in progress.

:class:`PositionTracker` keeps the stream's events in arrival order with a completion
check each. The checkpoint may move to the position of the last event of the longest
*completed prefix* (:func:`docoutbox.dispatch.checkpoint_after`): an unfinished event
holds back every later one.

A :class:`Sweep` pages through documents with pending entries; when it replaces a lost
stream position it carries a :class:`Gate`, an entry of the tracker that completes only
once the whole sweep has been dispatched.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice

from docoutbox.dispatch.flow import checkpoint_after
from docoutbox.dispatch.ports import Position
from docoutbox.model import AggregateId

Done = Callable[[], bool]


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

    def reset(self, position: Position, gate: Gate) -> None:
        """Restart from ``position``, which becomes safe once ``gate`` is done."""
        self._events.clear()
        self.latest = position
        self._events.append((position, gate.done))


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
    started: bool = False
    pages: int = 0
    requested: int = 0
