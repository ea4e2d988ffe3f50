"""The lease keeper over the in-memory lease table, with workers on threads.

Here: workers on threads inside a lease; the pure planning is in
``tests/unit/test_leases.py``.
"""

from __future__ import annotations

import threading

from docoutbox.testing.dispatch import MemoryLeaseTable
from tests.unit.test_leases import NOW, Clock, keeper


def test_a_lease_is_released_only_once_no_worker_is_inside() -> None:
    table, clock = MemoryLeaseTable(), Clock()
    a = keeper(table, "a", clock, partitions=2)
    a.tick()
    assert a.enter(1)
    released = threading.Event()

    def stop() -> None:
        a.stop(release=True)
        released.set()

    t = threading.Thread(target=stop)
    t.start()
    assert not released.wait(0.3)
    assert table.leases.get(1, ("", NOW))[0] == "a"
    assert not a.enter(1)  # no new work starts meanwhile,
    assert a.valid(1)  # but the worker inside may still publish and trim
    a.leave(1)
    t.join(5)
    assert released.is_set()
    assert table.leases == {} and table.members == {}
