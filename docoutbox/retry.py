"""The one backoff policy: store conflicts, publish retries and the dispatcher's scheduler."""

from __future__ import annotations

import random
from dataclasses import dataclass

from docoutbox.errors import InvalidConfig

#: The largest count a setting takes (sizes and counts in memory, attempts): 32 bits is
#: far beyond any useful value, and a larger one is a typo.
MAX_COUNT = 2**31 - 1


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a bool) in ``[low, high]``, else InvalidConfig."""
    if type(value) is not int:
        raise InvalidConfig(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidConfig(f"{name} must be {bound}, got {value}")
    return value


#: The longest wait a setting may ask for (threads and event loops refuse far longer ones).
MAX_SECONDS = 30 * 86_400.0


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` if it is a non-negative (or positive) number of seconds, at most
    :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfig(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    if not 0 <= value <= MAX_SECONDS or (positive and value == 0):
        kind = "positive" if positive else "non-negative"
        raise InvalidConfig(
            f"{name} must be a {kind} number of seconds up to {MAX_SECONDS:.0f}, got {value}"
        )
    return float(value)


def backoff(
    attempt: int, base: float, cap: float, rng: random.Random, *, floor: float = 0.0
) -> float:
    """Exponential backoff with jitter: a random delay in ``[floor, 1] x min(cap, base x 2^(n-1))``.

    ``floor=0`` is "full jitter" (spreads retries best); a positive floor keeps a minimum
    wait.
    """
    step = min(cap, base * 2.0 ** max(0, attempt - 1))
    return rng.uniform(floor * step, step)


#: The default bound of a store call's retries of transient errors, in seconds.
DEFAULT_DEADLINE = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter.

    ``max_attempts`` bounds the attempts of one store call; ``deadline`` bounds the time
    it keeps retrying transient errors (an unreachable database): once ``deadline``
    seconds have passed since the call began, the next transient error is raised instead
    of retried, so a call against a database that is down fails with a
    :class:`~docoutbox.errors.TransientStoreError` after about ``deadline`` seconds plus
    at most one attempt's own timeout (the driver's: pymongo's server selection waits 30 s
    by default, so such a call ends after about 30 s instead of 10 x 30 s). None: only
    ``max_attempts`` bounds it. Conflicts are bounded by ``max_attempts`` alone.
    """

    max_attempts: int = 10
    base_delay: float = 0.002
    max_delay: float = 0.25
    deadline: float | None = DEFAULT_DEADLINE

    def __post_init__(self) -> None:
        check_int("RetryPolicy.max_attempts", self.max_attempts, 1, 1_000_000)
        check_seconds("RetryPolicy.base_delay", self.base_delay)
        check_seconds("RetryPolicy.max_delay", self.max_delay)
        if self.deadline is not None:
            check_seconds("RetryPolicy.deadline", self.deadline, positive=True)
        if self.max_delay < self.base_delay:
            raise InvalidConfig(
                f"RetryPolicy.max_delay ({self.max_delay}) must not be below "
                f"base_delay ({self.base_delay})"
            )

    def delay(self, attempt: int, rng: random.Random) -> float:
        return backoff(attempt, self.base_delay, self.max_delay, rng)

    def out_of_time(self, elapsed: float) -> bool:
        """Whether a call that began ``elapsed`` seconds ago must stop retrying transient
        errors."""
        return self.deadline is not None and elapsed >= self.deadline


@dataclass(frozen=True)
class Backoff:
    """Waits between runs that failed: ``min(cap, base * 2**(n-1))`` times ``floor`` to 1."""

    base: float = 0.1
    cap: float = 10.0
    floor: float = 0.5

    def delay(self, failures: int, rng: random.Random) -> float:
        return backoff(failures, self.base, self.cap, rng, floor=self.floor)
