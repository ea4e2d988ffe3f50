"""A tiny run of the Cosmos DB benchmarks, so their code cannot rot. Nothing here looks at
speed; the round-trip counts asserted are structural."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import cosmos
from benchmarks.__main__ import main
from benchmarks.common import Scale
from benchmarks.servers import CosmosAccount

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


def test_the_aio_benchmarks_run_and_count_round_trips(cosmos_server: CosmosAccount) -> None:
    handle, drain = cosmos.run(cosmos_server, Scale.quick(), ["handle-aio", "drain-aio"])
    trips = {name: f["round_trips_per_message"] for name, f in handle.figures.items()}
    assert trips["docoutbox aio cold (cache off)"] == trips["raw aio read + patch"] == 2
    assert trips["docoutbox aio warm (cached)"] == trips["raw aio cached patch"]
    assert trips["raw aio cached patch"] < 2
    assert all(f["per_s"] > 0 for f in handle.figures.values())
    assert drain.figures["dispatcher_per_s"] > 0 and drain.figures["raw_per_s"] > 0
    assert drain.figures["dispatcher_requests"] >= drain.figures["raw_requests"]


def test_the_runner_runs_a_cosmos_benchmark_alone(
    cosmos_server: CosmosAccount, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scripts/bench --only cosmos_drain_aio`` runs that benchmark and nothing else."""

    @contextlib.contextmanager
    def account() -> Iterator[CosmosAccount]:
        yield cosmos_server

    monkeypatch.setattr(cosmos, "cosmos_account", account)
    out = tmp_path / "results.json"
    assert main(["--quick", "--only", "cosmos_drain_aio", "--out", str(out)]) == 0
    assert list(json.loads(out.read_text())["benchmarks"]) == ["cosmos_drain_aio"]
