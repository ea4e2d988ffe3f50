"""A tiny run of the Cosmos DB benchmarks, so their code cannot rot. Nothing here looks at
speed; the round-trip counts asserted are structural."""

from __future__ import annotations

import pytest

from benchmarks import cosmos
from benchmarks.common import Scale
from tests.support.servers import CosmosAccount

pytestmark = pytest.mark.cosmos


def test_cosmos_benchmarks_run_and_count_round_trips(cosmos_server: CosmosAccount) -> None:
    handle, drain = cosmos.run(cosmos_server, Scale.quick(), ["handle", "drain"])
    variants = {n: f for n, f in handle.figures.items() if n in cosmos.HANDLE_BASELINES}
    assert set(variants) == set(cosmos.HANDLE_BASELINES)
    trips = {name: f["round_trips_per_message"] for name, f in variants.items()}
    assert trips["docoutbox cold (cache off)"] == trips["raw read + patch"] == 2
    assert trips["docoutbox warm (cached)"] == trips["raw cached patch"]
    assert trips["raw cached patch"] < 2
    assert all(f["per_s"] > 0 and f["client_cpu_ms_per_message"] > 0 for f in variants.values())
    assert (
        handle.figures["run"]["rounds"] == 1
        and len(handle.figures["run"]["load_average_after"]) == 3
    )
    assert drain.figures["dispatcher_per_s"] > 0 and drain.figures["raw_per_s"] > 0
