"""The batch and group-commit benchmarks run at a tiny scale and report sane figures."""

from __future__ import annotations

import pytest

from benchmarks import batch, immediate
from benchmarks.common import Scale

pytestmark = pytest.mark.wire


def test_batch_benchmark_counts_fewer_round_trips_per_message(mongo_uri: str) -> None:
    table = batch.batching(mongo_uri, Scale.quick())
    trips = table.figures["round_trips_per_message"]
    assert trips["per message"] == pytest.approx(1.0)
    assert trips["batch 10"] <= 0.2
    assert trips["batch 100"] <= 0.05


def test_group_commit_benchmark_never_exhausts_retries_with_group_commit(mongo_uri: str) -> None:
    table = batch.group_commit(mongo_uri, Scale.quick())
    gave_up = table.figures["gave_up"]
    assert gave_up["threads: 16 writers, group commit"] == 0
    assert gave_up["tasks: 16 writers, group commit"] == 0


def test_immediate_benchmark_publishes_everything(mongo_uri: str) -> None:
    table = immediate.run(mongo_uri, Scale.quick())
    assert table.figures["immediate, one process"]["duplicates_per_message"] == 0
    assert table.figures["asyncio: immediate, one process"]["duplicates_per_message"] == 0
