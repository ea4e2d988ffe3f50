"""A tiny run of the Cosmos DB dispatch-cost benchmark (``benchmarks.cosmos_dispatch``), so
its code cannot rot. Nothing here looks at speed; the request counts asserted are
structural: a drain trims each aggregate with one patch, publish-only trims nothing."""

from __future__ import annotations

import uuid

import pytest

from benchmarks import cosmos_dispatch as bench
from benchmarks.servers import CosmosAccount

pytestmark = pytest.mark.cosmos

CONTESTANTS = [bench.HAND_WRITTEN, bench.DISPATCHER, bench.PUBLISH_ONLY, "deferred trims (5 s)"]


def test_drain_and_hot_workload_count_trims_per_entry(cosmos_server: CosmosAccount) -> None:
    scaled = bench.Scaled(
        drain_aggregates=6,
        drain_per_aggregate=3,
        drain_rounds=1,
        hot_aggregates=4,
        hot_seconds=1.5,
        hot_rounds=1,
        writers=2,
        single_aggregates=5,
    )
    with cosmos_server.client() as client:
        database = client.create_database(f"docoutbox_bench_{uuid.uuid4().hex[:8]}")
        try:
            drain = bench.drain(database, cosmos_server, scaled, [*CONTESTANTS, bench.ASYNC])
            hot = bench.hot(database, cosmos_server, scaled, CONTESTANTS)
            single = bench.drain(
                database,
                cosmos_server,
                scaled,
                [bench.HAND_WRITTEN, bench.DISPATCHER, bench.PUBLISH_ONLY],
                single=True,
            )
        finally:
            client.delete_database(database.id)
    for table in (drain, hot):
        for name in CONTESTANTS:
            figures = table.figures[name]
            assert figures["published_more_than_once"] == 0, (table.key, name)
            assert figures["per_s"] > 0
            assert figures["ru_per_entry"] > 0  # the feed's responses at least
        only = table.figures[bench.PUBLISH_ONLY]
        assert only["trim_requests_per_entry"] == 0 and only["left_after_stop"] > 0
        for name in (bench.HAND_WRITTEN, bench.DISPATCHER, "deferred trims (5 s)"):
            assert table.figures[name]["left_after_stop"] == 0, (table.key, name)
    # Nothing writes during a drain: one patch per aggregate, if-match on the feed's copy.
    for name in (bench.HAND_WRITTEN, bench.DISPATCHER, bench.ASYNC, "deferred trims (5 s)"):
        assert drain.figures[name]["trim_requests_per_entry"] == pytest.approx(1 / 3)
        assert drain.figures[name]["published_more_than_once"] == 0
    assert drain.figures[bench.PUBLISH_ONLY]["max_outbox"] == 3
    # One entry per aggregate: one trim per entry.
    for name in (bench.HAND_WRITTEN, bench.DISPATCHER):
        assert single.figures[name]["trim_requests_per_entry"] == 1
        assert single.figures[name]["published"] == 5
