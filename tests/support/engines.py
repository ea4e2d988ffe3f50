"""A dispatch engine driven by hand, over documents with pending entries: the engine
tests' shared builders (no driver, no clock: time stands at :data:`T0`)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig

T0 = datetime(2030, 1, 1, tzinfo=UTC)

#: Each batch writes its own trims.
OWN_TRIMS = DispatcherConfig(name="b", trim_delay=0)


def entry(aggregate: str, n: int) -> dict[str, Any]:
    """The pending entry ``n`` (its ``seq``) of ``aggregate``, ID ``"{aggregate}-{n}"``."""
    return {
        "id": f"{aggregate}-{n}",
        "type": "Added",
        "payload": {},
        "created_at": T0,
        "seq": n,
        "aggregate_id": aggregate,
        "aggregate_type": "Counter",
    }


def doc(aggregate: str, entries: int = 1) -> dict[str, Any]:
    """``aggregate``'s document with ``entries`` pending entries, seq 1 to ``entries``."""
    outbox = [entry(aggregate, n) for n in range(1, entries + 1)]
    return {"_id": aggregate, "partition": 0, "version": entries, "outbox": outbox}


def engine_with(
    *docs: dict[str, Any],
    ownership: SoleOwner | None = None,
    config: DispatcherConfig = OWN_TRIMS,
) -> DispatchEngine:
    """An engine on a stream without checkpoints, with a run requested for each of
    ``docs``, in order."""
    engine = DispatchEngine(
        config,
        ownership or SoleOwner(),
        stream=True,
        checkpoints=False,
        monotonic=lambda: 0.0,
        clock=lambda: T0,
        rng=random.Random(0),
    )
    for d in docs:
        engine.request(d)
    return engine
