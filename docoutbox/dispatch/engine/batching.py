"""How the runs that may begin are dealt to the free workers, as batches.

Rule: with publish rounds (:attr:`~docoutbox.dispatch.engine.loop.DispatchEngine.rounds`:
a publisher that keeps confirmations in flight together), runs are **packed**: as few
workers as hold them at ``run_batch`` runs each at most, evenly. A worker runs its batch
in lockstep (:meth:`~docoutbox.dispatch.engine.loop.DispatchEngine.run_batch`), one entry
per aggregate per round (I4), so a batch of ``n`` runs sends rounds of up to ``n``
entries: each round costs one round trip to the broker and one wake-up of its worker,
whatever its size, and spreading 200 runs over 32 workers made ten rounds of about 6
entries each where 13 workers make ten rounds of about 16.

Without rounds (a publisher that confirms each publish before it returns, one at a
time), runs are **spread**: one per free worker while there are fewer runs than
workers, else over all of them, so that as many publishes as possible wait for their
confirmations at once.

Either way only runs already begun are grouped: a lone run goes out at once, in a batch
of its own, and no batch waits to fill.
"""

from __future__ import annotations

from typing import TypeVar

from docoutbox.errors import InvalidConfig

T = TypeVar("T")


def deal(slots: list[T], workers: int, run_batch: int, *, rounds: bool) -> list[list[T]]:
    """``slots`` as at most ``workers`` batches of about equal size: with ``rounds``, as
    few as hold them at ``run_batch`` each (more each only past ``workers`` x
    ``run_batch`` slots, which the engine never starts at once), else spread over every
    worker (see the module docstring). Every slot is in exactly one batch; none is
    empty."""
    if workers < 1 or run_batch < 1:
        raise InvalidConfig(
            f"runs are dealt to at least one worker, at least one run each "
            f"(workers={workers}, run_batch={run_batch})"
        )
    wanted = -(-len(slots) // run_batch) if rounds else len(slots)
    count = min(workers, wanted)
    return [slots[i::count] for i in range(count)]
