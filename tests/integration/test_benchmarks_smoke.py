"""A tiny run of every benchmark against the wire server, so the benchmark code cannot rot.

Nothing here looks at speed. The benchmarks check their own outcomes (every message
applied exactly once, every entry published exactly once, nothing left pending) and
raise otherwise; the round-trip counts asserted below are structural, not timings.

The benchmarks run against the servers; the structural checks that need none stay in
``tests/unit/test_benchmarks_smoke.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import benchmarks.__main__ as runner
from benchmarks import (
    claim,
    codec,
    dispatch,
    endpoint,
    kafka,
    kafka_consume,
    lag,
    memory,
    rabbitmq,
    store,
    structure,
    tracing,
)
from benchmarks.__main__ import main
from benchmarks.common import Scale, Table
from tests.support.e2e import require_rabbitmq
from tests.support.kafka import require_kafka

pytestmark = pytest.mark.wire

QUICK = Scale.quick()


def _numbers(table: Table) -> list[float]:
    return [cell for row in table.rows for cell in row if isinstance(cell, int | float)]


def _sane(table: Table) -> None:
    assert table.rows
    assert all(len(row) == len(table.columns) for row in table.rows)
    assert all(math.isfinite(x) and x >= 0 for x in _numbers(table))
    json.dumps(table.to_json(), default=str)
    assert table.to_markdown().startswith(f"### {table.title}")


def test_structure_counts_round_trips_per_message(mongo_uri: str) -> None:
    table = structure.run(mongo_uri, QUICK)
    _sane(table)
    trips = {name: f["round_trips_per_message"] for name, f in table.figures.items()}
    assert trips["docoutbox, aggregate cached and current"] == 1
    assert trips["docoutbox, aggregate not cached (load + commit)"] == 2
    assert trips["docoutbox, redelivered, cached"] == 0
    assert trips["docoutbox, redelivered, not cached"] == 1
    assert trips["docoutbox, cached copy stale (another writer)"] == 3
    assert trips["docoutbox, first message creates the aggregate"] == 2
    assert trips["classic: processed marker + load + update + outbox insert"] == 4
    assert trips["classic: load + update + outbox insert"] == 3
    commit = table.figures["docoutbox, aggregate cached and current"]["commands"]
    assert commit == {"update": 1.0}


@pytest.mark.parametrize(
    ("bench", "rows"),
    [(store.versus_raw, 4), (store.versus_classic, 4), (store.inbox_cost, 7)],
)
def test_throughput_benchmarks_run(mongo_uri: str, bench: Any, rows: int) -> None:
    table = bench(mongo_uri, QUICK)
    _sane(table)
    assert len(table.rows) == rows


def test_hot_aggregate_runs(mongo_uri: str) -> None:
    table = store.hot_aggregate(mongo_uri, QUICK)
    _sane(table)
    assert len(table.figures["warm"]) == len(table.figures["cold"]) >= 2


def test_dispatch_benchmark_runs(mongo_uri: str) -> None:
    table = dispatch.run(mongo_uri, QUICK)
    _sane(table)
    readers = {"raw", "floor", "dispatcher", "async"}
    assert set(table.figures) == readers | {"round_trips_per_entry"}
    assert set(table.figures["round_trips_per_entry"]) == {"dispatcher", "async"}
    for reader in readers:
        assert table.figures[reader]["drain_1_vs_floor"] > 0
    # The floor is not measured live: only the drain.
    assert "p99_ms" not in table.figures["floor"]
    assert "p99_ms" in table.figures["async"]


def test_tracing_benchmark_runs(mongo_uri: str) -> None:
    table = tracing.run(mongo_uri, QUICK)
    _sane(table)
    assert len(table.rows) == 4
    assert {"handle_wire", "handle_memory", "dispatch_wire", "publish_memory"} == set(table.figures)


def test_codec_benchmark_runs(mongo_uri: str) -> None:
    table = codec.run(mongo_uri, QUICK)
    _sane(table)
    assert set(table.figures) == {
        "handle_wire",
        "handle_memory",
        "handle_memory_backlog",
        "dispatch_flow_memory",
        "stored_bytes",
    }
    assert len(table.rows) == 4 * 5
    assert table.figures["stored_bytes"]["zlib"] < table.figures["stored_bytes"]["plain"]


def test_claim_benchmark_runs(mongo_uri: str) -> None:
    table = claim.run(mongo_uri, QUICK)
    assert len(table.rows) == 2 * 4
    bytes_ = {key: figure["document_bytes"] for key, figure in table.figures.items() if " " in key}
    assert bytes_["256 KB claim"] < 1024 < 256 * 1024 < bytes_["256 KB plain"]
    assert bytes_["1 KB claim"] == bytes_["1 KB plain"]  # under the threshold: not moved


def test_memory_benchmark_runs(mongo_uri: str) -> None:
    table = memory.run(mongo_uri, QUICK)
    _sane(table)
    assert set(table.figures) == set(memory.MODES)


@pytest.mark.kafka
def test_kafka_benchmark_runs(mongo_uri: str) -> None:
    require_kafka()
    table = kafka.run(mongo_uri, QUICK)
    _sane(table)
    assert set(table.figures) == {f"per_aggregate_{d}" for d in kafka.DENSITIES} | {"live"}
    assert set(table.figures["per_aggregate_10"]) == set(kafka.LABELS)
    assert set(table.figures["live"]) == set(kafka.KINDS)


@pytest.mark.rabbitmq
def test_rabbitmq_benchmark_runs(mongo_uri: str) -> None:
    require_rabbitmq()
    table = rabbitmq.run(mongo_uri, QUICK)
    _sane(table)
    assert set(table.figures) == {f"per_aggregate_{d}" for d in rabbitmq.DENSITIES}
    for figures in table.figures.values():
        assert set(figures) == set(rabbitmq.LABELS)


@pytest.mark.kafka
def test_kafka_consume_benchmark_runs(mongo_uri: str) -> None:

    require_kafka()
    table = kafka_consume.run(mongo_uri, QUICK)
    _sane(table)
    assert set(table.figures) == {
        f"{name}/{variant}"
        for name in kafka_consume.DENSITIES
        for variant in ("per-record", "batch")
    }


def test_runner_writes_results(
    mongo_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    out = tmp_path / "results.json"
    assert main(["--quick", "--only", "structure", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["quick"] is True
    assert set(results["benchmarks"]) == {"structure"}
    assert results["machine"]["cpus"] >= 1


def test_a_quick_run_leaves_the_recorded_results_alone(
    mongo_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    recorded, quick = tmp_path / "results.json", tmp_path / "results-quick.json"
    monkeypatch.setattr(runner, "DEFAULT_OUT", recorded)
    monkeypatch.setattr(runner, "QUICK_OUT", quick)
    recorded.write_text('{"quick": false, "benchmarks": {"raw": {"rows": ["recorded"]}}}')
    assert main(["--quick", "--only", "structure"]) == 0
    assert json.loads(recorded.read_text())["benchmarks"] == {"raw": {"rows": ["recorded"]}}
    assert set(json.loads(quick.read_text())["benchmarks"]) == {"structure"}


@pytest.mark.rabbitmq
def test_endpoint_against_a_plain_consumer_loop(mongo_uri: str) -> None:
    require_rabbitmq()
    table = endpoint.run(mongo_uri, QUICK)
    _sane(table)
    assert [row[0] for row in table.rows][:3] == ["plain", "consumer", "endpoint"]


def test_lag_benchmark_runs(mongo_uri: str) -> None:
    """It checks every partition's figures before timing, and raises if they are wrong."""
    table = lag.run(mongo_uri, QUICK)
    _sane(table)
    assert {"count", "work", "stats", "fill_seconds"} == set(table.figures)
