"""Runs in lockstep: a worker publishes several aggregates' entries, then trims them all in
one round; one run's failure neither stops nor fails the others.

Here: writes in flight on threads and on an event loop; the pure parts are in
``tests/unit/test_run_batch.py``.
"""

from __future__ import annotations

import asyncio

from docoutbox.dispatch.drivers.operations import AsyncGroupWriter, GroupWriter
from docoutbox.errors import StoreError, TransientStoreError
from docoutbox.store.plans import TrimPlan, WritePlan, plan_trim


class OnePerRequest:
    """A backend without ``write_many``: one plan per request; refuses aggregate ``x``."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def write(self, plan: WritePlan) -> bool:
        assert isinstance(plan, TrimPlan)
        if plan.aggregate_id == "x":
            raise TransientStoreError("throttled")
        self.written.append(str(plan.aggregate_id))
        return True


def test_write_all_without_write_many_writes_each_and_keeps_each_error() -> None:
    backend = OnePerRequest()
    writer = GroupWriter(backend, direct_workers=2)
    try:
        outcomes = writer.write_all([plan_trim(a, ["e"]) for a in "axb"])
    finally:
        writer.close()
    assert outcomes[0] is True and outcomes[2] is True
    assert isinstance(outcomes[1], StoreError)
    assert sorted(backend.written) == ["a", "b"]


def test_async_write_all_without_write_many_caps_the_writes_in_flight() -> None:
    class Slow:
        def __init__(self) -> None:
            self.now = self.most = 0

        async def write(self, plan: WritePlan) -> bool:
            self.now += 1
            self.most = max(self.most, self.now)
            await asyncio.sleep(0.001)
            self.now -= 1
            if isinstance(plan, TrimPlan) and plan.aggregate_id == "x":
                raise TransientStoreError("throttled")
            return True

    backend = Slow()
    writer = AsyncGroupWriter(backend, direct_workers=3)
    outcomes = asyncio.run(writer.write_all([plan_trim(a, ["e"]) for a in "abcxdefgh"]))
    assert backend.most == 3
    assert [isinstance(o, StoreError) for o in outcomes] == [False] * 3 + [True] + [False] * 5
