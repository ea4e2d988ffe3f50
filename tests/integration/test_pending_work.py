"""Pending work per partition (MongoDB, wire server) and per feed range (Cosmos DB, local
server): ``docoutbox outbox lag`` and the ``docoutbox_pending_work_*`` metrics agree with
what the database holds, and a KEDA-style scale decision is taken from the scraped
metric."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from docoutbox import AggregateStore, StoreConfig
from docoutbox.dispatch.engine.backlog import BacklogMonitor
from docoutbox.dispatch.engine.lag import PendingWork, desired_replicas
from docoutbox.observability.prometheus import PrometheusMetrics
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_app.cli import main
from docoutbox_cosmos.admin import outbox_stats as cosmos_outbox_stats
from docoutbox_cosmos.admin import pending_work as cosmos_pending_work
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from docoutbox_mongo.admin import outbox_stats, pending_work
from tests.support.backends import BACKENDS, Bundle, bundle_of

AGGREGATES = 12
PARTITIONS = 4


@pytest.fixture(params=BACKENDS)
def bundle(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bundle]:
    for name in ("COSMOS_ENDPOINT", "COSMOS_KEY", "COSMOS_CA_FILE", "DOCOUTBOX_MONGO_URI"):
        monkeypatch.delenv(name, raising=False)
    with bundle_of(request.param, request) as made:
        yield made


def fill(bundle: Bundle, stored: dict[int, int] | None = None) -> dict[int, int]:
    """Aggregates with 0, 1 or 2 pending entries; the entries expected per partition (the
    stored partition on MongoDB, the feed range its lease covers on Cosmos DB), and per
    stored partition in ``stored``."""
    store = AggregateStore(bundle.store_backend(), Counter, StoreConfig(partitions=PARTITIONS))
    for i in range(AGGREGATES):
        store.handle(f"w{i}", add_msg(f"m{i}", emits=i % 3), counter_handlers, create=True)
    expected: dict[int, int] = defaultdict(int)
    for i in range(AGGREGATES):
        snapshot = store.load(f"w{i}")
        assert snapshot is not None
        if snapshot.outbox:
            expected[where(bundle, f"w{i}", snapshot.partition)] += len(snapshot.outbox)
            if stored is not None:
                stored[snapshot.partition] = stored.get(snapshot.partition, 0) + len(
                    snapshot.outbox
                )
    return dict(expected)


def where(bundle: Bundle, aggregate_id: str, partition: int) -> int:
    if bundle.kind == "mongo":
        return partition

    table = CosmosFeedRangeLeases(bundle.leases, bundle.coll, "aggs")  # type: ignore[attr-defined]
    return table.locate({"_id": aggregate_id})


@pytest.mark.wire
def test_the_partial_index_holds_only_documents_with_pending_entries(
    request: pytest.FixtureRequest,
) -> None:
    """MongoDB only: Cosmos DB's default indexing policy serves its query."""
    with bundle_of("mongo", request) as bundle:
        check_partial_index(bundle)


def check_partial_index(bundle: Bundle) -> None:
    fill(bundle)
    bundle.store_backend().ensure_indexes()
    index = bundle.coll.index_information()["docoutbox_pending_partition"]
    assert index["key"] == [("partition", 1)]
    assert index["partialFilterExpression"] == {"outbox.0": {"$exists": True}}
    assert measure(bundle).entries == 12  # the same figures with the index in place


def measure(bundle: Bundle) -> PendingWork:
    if bundle.kind == "mongo":
        return pending_work(bundle.coll, PARTITIONS)

    return cosmos_pending_work(bundle.coll)


def cli_where(bundle: Any) -> tuple[str, ...]:
    if bundle.kind == "mongo":
        return ("--mongo-uri", bundle.uri, "--db", bundle.db.name, "--partitions", "4")
    account = ("--cosmos-endpoint", bundle.account.endpoint, "--cosmos-key", bundle.account.key)
    return (*account, "--db", bundle.db.id)


def test_pending_work_per_partition_matches_the_database(
    bundle: Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    stored: dict[int, int] = {}
    expected = fill(bundle, stored)
    work = measure(bundle)
    assert work.unit == ("partition" if bundle.kind == "mongo" else "feed_range")
    assert work.partitions == PARTITIONS  # four stored partitions; four feed ranges
    assert sorted(work.by_partition) == list(range(PARTITIONS))  # idle ones included
    assert {p: b.entries for p, b in work.by_partition.items() if b.entries} == expected
    assert work.entries == sum(i % 3 for i in range(AGGREGATES))
    assert work.aggregates == sum(1 for i in range(AGGREGATES) if i % 3)
    assert all(0 <= b.oldest_age < 60 for b in work.by_partition.values())
    assert work.unassigned.entries == 0

    capsys.readouterr()
    common = (*cli_where(bundle), "--collection", "aggs")
    code = main(["outbox", "lag", *common, "--json", "--target-per-replica", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    shown = json.loads(out)
    assert {int(p): b["entries"] for p, b in shown["by_partition"].items() if b["entries"]} == (
        expected
    )
    assert (shown["entries"], shown["partitions"], shown["desired_replicas"]) == (12, 4, 3)
    code = main(["outbox", "lag", *common])
    out, err = capsys.readouterr()
    assert code == 0 and "12 entries on 8 aggregates" in out, err
    assert ("feed range" if bundle.kind == "cosmos" else "partition") in out
    if bundle.kind == "cosmos":  # grouped by the stored partition number instead
        code = main(["outbox", "lag", *common, "--by", "partition", "--partitions", "4", "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        shown = json.loads(out)
        assert shown["unit"] == "partition" and len(shown["by_partition"]) == 4
        assert {int(p): b["entries"] for p, b in shown["by_partition"].items() if b["entries"]} == (
            stored
        )


@pytest.mark.parametrize(("target", "replicas"), [(5, 3), (1, PARTITIONS), (100, 1)])
def test_a_keda_style_decision_is_taken_from_the_scraped_metric(
    bundle: Bundle, target: int, replicas: int
) -> None:
    """Two dispatcher instances export the same figures: the scaler takes one series per
    partition (``max by (partition)``), sums them, and asks for ``ceil(pending / target)``
    replicas, at most one per partition."""
    fill(bundle)
    scraped = []
    for _instance in range(2):
        metrics = PrometheusMetrics()
        monitor = BacklogMonitor(stats_probe(bundle), [metrics], work=lambda: measure(bundle))
        assert monitor.measure() is not None and monitor.last_work is not None
        scraped.append(metrics.exposition()[0].decode())
    per_partition: dict[str, float] = {}
    partitions = 0.0
    for text in scraped:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "docoutbox_pending_work_entries":
                    key = sample.labels["partition"]
                    per_partition[key] = max(per_partition.get(key, 0.0), sample.value)
                elif sample.name == "docoutbox_pending_work_partitions":
                    partitions = max(partitions, sample.value)
    pending = sum(per_partition.values())
    assert (pending, partitions, len(per_partition)) == (12, PARTITIONS, PARTITIONS)
    decision = desired_replicas(int(pending), target, int(partitions))
    assert decision == replicas == min(math.ceil(12 / target), PARTITIONS)


def stats_probe(bundle: Bundle) -> Any:
    if bundle.kind == "mongo":
        return lambda: outbox_stats(bundle.coll)

    return lambda: cosmos_outbox_stats(bundle.coll)
