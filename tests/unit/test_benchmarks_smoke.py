"""A tiny run of every benchmark against the wire server, so the benchmark code cannot rot.

Nothing here looks at speed. The benchmarks check their own outcomes (every message
applied exactly once, every entry published exactly once, nothing left pending) and
raise otherwise; the round-trip counts asserted below are structural, not timings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS, DEFAULT_OUT, merged
from benchmarks.common import paired_ratio, percentile

pytestmark = pytest.mark.wire


def test_a_run_of_some_benchmarks_keeps_the_others_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    out.write_text(
        json.dumps(
            {
                "quick": False,
                "seconds": {"raw": 13.0, "dispatch": 170.0, "total": 183.0},
                "benchmarks": {"raw": {"rows": ["old"]}, "dispatch": {"rows": ["old"]}},
                "runs": {"kept": True},
            }
        )
    )
    run = {"quick": False, "seconds": {"raw": 11.0, "total": 11.0}, "benchmarks": {"raw": {}}}
    combined = merged(out, run)
    assert combined["benchmarks"] == {"raw": {}, "dispatch": {"rows": ["old"]}}
    assert combined["seconds"] == {"raw": 11.0, "dispatch": 170.0, "total": 11.0}
    assert combined["runs"] == {"kept": True}
    # A quick run never mixes with full figures, and an unreadable file is replaced.
    assert merged(out, {**run, "quick": True}) == {**run, "quick": True}
    out.write_text("{not json")
    assert merged(out, run) == run


def test_helpers() -> None:
    assert paired_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 4.0]) == 2.0
    assert percentile([float(x) for x in range(1, 101)], 50) == 50
    assert percentile([float(x) for x in range(1, 101)], 99) == 99
    assert percentile([5.0], 99) == 5.0


def test_the_recorded_results_hold_every_benchmark() -> None:
    """``benchmarks/results.json`` is what BENCHMARKS.md and the benchmarks page quote: a
    full run of every default benchmark, never emptied or left quick by a partial write."""
    recorded = json.loads(DEFAULT_OUT.read_text())
    assert recorded.get("quick") is False
    assert set(BENCHMARKS) <= set(recorded.get("benchmarks", {}))
