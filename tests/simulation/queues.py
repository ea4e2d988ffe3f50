"""An at-least-once queue: the simulated broker, and the clients' command channel.

A message stays in the queue until a consumer acknowledges it. A consumer that crashes
or rejects a delivery gives it back. The simulator decides duplicates and delays when it
puts a message; with ``reorder`` a consumer receives any visible message, not the oldest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Delivery(Generic[T]):
    tag: int
    body: T
    redelivered: bool


@dataclass
class _Waiting(Generic[T]):
    visible_at: int
    body: T
    redelivered: bool


class Queue(Generic[T]):
    def __init__(self, name: str, rng: random.Random, *, reorder: bool) -> None:
        self.name = name
        self._rng = rng
        self._reorder = reorder
        self._waiting: list[_Waiting[T]] = []
        self._inflight: dict[int, tuple[T, str]] = {}
        self._tags = 0
        self.deliveries = 0
        self.redeliveries = 0

    def put(self, body: T, visible_at: int) -> None:
        self._waiting.append(_Waiting(visible_at, body, False))

    def take(self, now: int, owner: str) -> Delivery[T] | None:
        """A visible message, now in flight for ``owner``; None when none is visible."""
        visible = [i for i, item in enumerate(self._waiting) if item.visible_at <= now]
        if not visible:
            return None
        index = self._rng.choice(visible) if self._reorder else visible[0]
        item = self._waiting.pop(index)
        self._tags += 1
        self._inflight[self._tags] = (item.body, owner)
        self.deliveries += 1
        self.redeliveries += item.redelivered
        return Delivery(self._tags, item.body, item.redelivered)

    def ack(self, tag: int) -> None:
        del self._inflight[tag]

    def nack(self, tag: int, now: int) -> None:
        body, _ = self._inflight.pop(tag)
        self._waiting.append(_Waiting(now, body, True))

    def release(self, owner: str, now: int) -> int:
        """Give back everything in flight for ``owner`` (its connection died)."""
        tags = [tag for tag, (_, holder) in self._inflight.items() if holder == owner]
        for tag in tags:
            self.nack(tag, now)
        return len(tags)

    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._waiting and not self._inflight

    def counts(self) -> tuple[int, int]:
        return len(self._waiting), len(self._inflight)
