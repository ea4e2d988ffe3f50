"""Continuous traffic on a few hot aggregates plus new ones, and the check that a
dispatcher's checkpoint keeps advancing meanwhile.

A dispatcher that never checkpoints while producers keep committing would replay its
whole history after every restart. :class:`HotTraffic` commits without pause on a handful
of hot aggregates (whose requests keep arriving while their runs are under way, so runs
are coalesced into follow-ups) and on aggregates never seen before (new documents that
sweeps keep finding). :func:`wait_each_moves` fails if a checkpoint value does not change
within a bound while that traffic goes on.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Hashable, Mapping

#: How long a checkpoint may stay put under traffic: many checkpoint intervals (tests use
#: 0.25 s or less), generous for a loaded machine. Not a speed measurement.
BOUND = 15.0


class HotTraffic:
    """Threads committing commands, three in four on ``hot`` aggregates, the rest on new
    ones, until :meth:`stop`. ``write(aggregate_id, message_id)`` commits one command."""

    def __init__(
        self,
        write: Callable[[str, str], None],
        *,
        hot: Collection[str] = ("hot0", "hot1", "hot2", "hot3"),
        seed: int = 0,
    ) -> None:
        self.write = write
        self.hot = sorted(hot)
        self.commands = 0
        self.errors: list[BaseException] = []
        self._seed = seed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _next(self) -> int:
        with self._lock:
            self.commands += 1
            return self.commands

    def start(self, threads: int = 2, pause: float = 0.002) -> HotTraffic:
        def work(index: int) -> None:
            rng = random.Random(self._seed * 1000 + index)
            try:
                while not self._stop.is_set():
                    n = self._next()
                    if rng.random() < 0.75:
                        aggregate_id = rng.choice(self.hot)
                    else:
                        aggregate_id = f"new{index}-{n}"
                    self.write(aggregate_id, f"cmd-{index}-{n}")
                    self._stop.wait(rng.uniform(0, 2 * pause))
            except BaseException as exc:
                self.errors.append(exc)

        for index in range(threads):
            thread = threading.Thread(target=work, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wait_commands(self, count: int, timeout: float = BOUND) -> None:
        deadline = time.monotonic() + timeout
        while self.commands < count:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"only {self.commands} commands committed"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not self.errors, self.errors


def wait_each_moves(
    read: Callable[[], Mapping[Hashable, object]],
    keys: Collection[Hashable],
    *,
    rounds: int = 3,
    within: float = BOUND,
    traffic: HotTraffic | None = None,
) -> list[float]:
    """For ``rounds`` rounds: note the checkpoint values ``read()[key]`` of ``keys``, then
    wait until every one of them has changed, at most ``within`` seconds. Returns each
    round's duration. Fails if a value stays put that long (or the traffic stopped)."""
    took = []
    for round_ in range(rounds):
        started = time.monotonic()
        before = read()
        while True:
            now = read()
            still = [k for k in keys if now.get(k) == before.get(k)]
            if not still:
                break
            if traffic is not None:
                assert not traffic.errors, traffic.errors
            waited = time.monotonic() - started
            assert waited < within, (
                f"round {round_}: the checkpoint of {still} did not move in {waited:.1f} s "
                f"while producers kept committing (still {[now.get(k) for k in still]!r})"
            )
            time.sleep(0.02)
        took.append(time.monotonic() - started)
    return took
