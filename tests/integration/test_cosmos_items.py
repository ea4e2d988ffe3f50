"""The Cosmos adapter's lease table under concurrent renewals.

Here: lease renewals sent concurrently, on threads; the pure parts are in
``tests/unit/test_cosmos_items.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from docoutbox_cosmos.coordination import CosmosLeaseTable
from tests.unit.test_cosmos_items import NOW, http_error


class SlowLeaseContainer:
    """Answers every patch after a pause, recording how many were in flight at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.patched: list[str] = []

    def patch_item(self, item: str, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(0.05)
        with self.lock:
            self.in_flight -= 1
            self.patched.append(item)
        if item.endswith("3"):
            raise http_error(412)  # not ours any more: skipped, not an error
        return {}


def test_lease_renewals_are_sent_concurrently() -> None:
    container = SlowLeaseContainer()
    table = CosmosLeaseTable(container, "g")
    table.renew(range(16), "me", NOW)
    assert len(container.patched) == 16
    assert container.most > 1
