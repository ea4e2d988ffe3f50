"""The one backoff policy: store conflicts, publish retries and the dispatcher's scheduler."""

from __future__ import annotations

import random
from dataclasses import dataclass


def backoff(
    attempt: int, base: float, cap: float, rng: random.Random, *, floor: float = 0.0
) -> float:
    """Exponential backoff with jitter: a random delay in ``[floor, 1] x min(cap, base x 2^(n-1))``.

    ``floor=0`` is "full jitter" (spreads retries best); a positive floor keeps a minimum
    wait.
    """
    step = min(cap, base * 2.0 ** max(0, attempt - 1))
    return rng.uniform(floor * step, step)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter."""

    max_attempts: int = 10
    base_delay: float = 0.002
    max_delay: float = 0.25

    def delay(self, attempt: int, rng: random.Random) -> float:
        return backoff(attempt, self.base_delay, self.max_delay, rng)
