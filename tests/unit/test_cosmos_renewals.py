"""Cosmos DB lease renewals run on one pool for the lease table's life: a heartbeat
renewing several leases never starts a new pool, the kit's close shuts it down, and a
heartbeat still waits for every renewal before it raises the first failure. The pool is
replaced by an inline one (the unit tier starts no thread)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from docoutbox_cosmos import coordination
from docoutbox_cosmos.coordination import RENEW_CONCURRENCY, CosmosLeaseTable
from docoutbox_cosmos.kit import CosmosKit
from docoutbox_cosmos.leases import CosmosFeedRangeLeases

EXPIRES = datetime(2026, 1, 1, tzinfo=UTC)


class Done:
    """A finished renewal: its failure, if any."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def exception(self) -> BaseException | None:
        return self.error


class InlinePool:
    """Runs each renewal at once; every pool made is kept in ``made``."""

    made: ClassVar[list[InlinePool]] = []

    def __init__(self, workers: int, thread_name_prefix: str = "") -> None:
        self.workers = workers
        self.shutdowns = 0
        InlinePool.made.append(self)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Done:
        try:
            fn(*args)
        except Exception as exc:
            return Done(exc)
        return Done(None)

    def shutdown(self, wait: bool = True) -> None:
        self.shutdowns += 1


@pytest.fixture(autouse=True)
def pools(monkeypatch: pytest.MonkeyPatch) -> list[InlinePool]:
    InlinePool.made = []
    monkeypatch.setattr(coordination, "ThreadPoolExecutor", InlinePool)
    return InlinePool.made


class Leases:
    """A lease container: records each patch; ``failing`` partitions' patches fail."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.patched: list[str] = []
        self.failing = failing

    def patch_item(self, item_id: str, **_: Any) -> dict[str, Any]:
        self.patched.append(item_id)
        if item_id in self.failing:
            raise RuntimeError(f"refused {item_id}")
        return {"_etag": "e"}


def test_repeated_heartbeats_renew_on_one_pool(pools: list[InlinePool]) -> None:
    container = Leases()
    table = CosmosLeaseTable(container, "g")
    table.renew([0], "me", EXPIRES)  # one lease: no pool at all
    assert pools == []
    for _ in range(5):
        table.renew([0, 1, 2], "me", EXPIRES)
    assert len(pools) == 1 and pools[0].workers == RENEW_CONCURRENCY
    assert len(container.patched) == 16
    table.close()
    table.close()
    assert pools[0].shutdowns == 1


def test_the_feed_range_leases_share_the_rule(pools: list[InlinePool]) -> None:
    table = CosmosFeedRangeLeases(Leases(), None, "g")
    for _ in range(3):
        table.renew([0, 1, 2, 3], "me", EXPIRES)  # none held: nothing written
    assert len(pools) == 1
    table.close()
    assert pools[0].shutdowns == 1


def test_a_heartbeat_waits_for_every_renewal_then_raises_the_first_failure() -> None:
    container = Leases()
    table = CosmosLeaseTable(container, "g")
    container.failing = (table._lease_id(1), table._lease_id(2))
    with pytest.raises(RuntimeError, match="refused"):
        table.renew([0, 1, 2, 3], "me", EXPIRES)
    assert len(container.patched) == 4  # the ones after the failures too


def test_closing_the_kit_shuts_the_renewals_down(pools: list[InlinePool]) -> None:
    class Client:
        closed = False

        def close(self) -> None:
            self.closed = True

    leases = CosmosFeedRangeLeases(Leases(), None, "g")
    leases.renew([0, 1], "me", EXPIRES)
    client = Client()
    kit = CosmosKit(client, None, None, None, leases, None)  # type: ignore[arg-type]
    kit.close()
    assert client.closed and pools[0].shutdowns == 1
