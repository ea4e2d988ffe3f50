"""In-memory change source, checkpoints and lease table for dispatcher tests."""

from __future__ import annotations

import copy
import threading
from collections.abc import Collection
from datetime import datetime

from docoutbox.errors import ChangeStreamLost
from docoutbox.ports.dispatch import ChangeEvent, LeaseView, Position
from docoutbox.testing.memory import MemoryBackend


class MemoryChangeSource:
    """The writes recorded in a :class:`MemoryBackend`'s ``changes``, as a change stream.

    A position is the number of changes already seen. Anything else, or a number beyond
    the end of the log (say, after a test truncated it), is an unusable position
    (:class:`ChangeStreamLost`).
    """

    def __init__(self, backend: MemoryBackend) -> None:
        self.backend = backend
        self._cursor: int | None = None
        self.opened: list[Position] = []

    def start_marker(self) -> Position:
        return len(self.backend.changes)

    def open(self, position: Position) -> None:
        if isinstance(position, bool) or not isinstance(position, int):
            raise ChangeStreamLost(f"not a position: {position!r}")
        if not 0 <= position <= len(self.backend.changes):
            raise ChangeStreamLost(f"position {position} is not in the change log")
        self._cursor = position
        self.opened.append(position)

    def poll(self, max_events: int) -> list[ChangeEvent]:
        if self._cursor is None:
            raise ChangeStreamLost("the stream is not open")
        start = self._cursor
        if start > len(self.backend.changes):
            raise ChangeStreamLost(f"position {start} is no longer in the change log")
        docs = self.backend.changes[start : start + max_events]
        self._cursor = start + len(docs)
        return [ChangeEvent(start + i + 1, copy.deepcopy(doc)) for i, doc in enumerate(docs)]

    def close(self) -> None:
        self._cursor = None


class MemoryCheckpoints:
    """Positions by dispatcher name, with every save recorded in ``history``."""

    def __init__(self) -> None:
        self.positions: dict[str, Position] = {}
        self.history: list[tuple[str, Position]] = []
        self._lock = threading.Lock()

    def load(self, name: str) -> Position | None:
        with self._lock:
            return self.positions.get(name)

    def save(self, name: str, position: Position) -> None:
        with self._lock:
            self.positions[name] = position
            self.history.append((name, position))


class MemoryLeaseTable:
    """One lease group in a dict, with the conditional semantics of the MongoDB table."""

    def __init__(self) -> None:
        self.leases: dict[int, tuple[str, datetime]] = {}
        self.members: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def read(self) -> LeaseView:
        with self._lock:
            return LeaseView(dict(self.leases), dict(self.members))

    def join(self, owner: str, expires_at: datetime) -> None:
        with self._lock:
            self.members[owner] = expires_at

    def leave(self, owner: str) -> None:
        with self._lock:
            self.members.pop(owner, None)

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        with self._lock:
            current = self.leases.get(partition)
            if current is not None and current[0] != owner and current[1] >= now:
                return False
            self.leases[partition] = (owner, expires_at)
            return True

    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        with self._lock:
            for p in partitions:
                if p in self.leases and self.leases[p][0] == owner:
                    self.leases[p] = (owner, expires_at)

    def release(self, partition: int, owner: str) -> None:
        with self._lock:
            if partition in self.leases and self.leases[partition][0] == owner:
                del self.leases[partition]

    def expire(self, owner: str, at: datetime) -> None:
        """Test helper: make every lease of ``owner`` expire at ``at``."""
        with self._lock:
            for p, (who, _) in list(self.leases.items()):
                if who == owner:
                    self.leases[p] = (who, at)
            if owner in self.members:
                self.members[owner] = at


__all__ = ["MemoryChangeSource", "MemoryCheckpoints", "MemoryLeaseTable"]
