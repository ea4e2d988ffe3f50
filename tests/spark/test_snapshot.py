"""The typed snapshot layout: documents typed once at export, audited with no JSON parse,
malformed documents kept with their raw text and reported as from the database, and older
raw snapshots still read and audited the same."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import StructType

from docoutbox_spark.conform import conform, is_typed, typed_layout
from docoutbox_spark.readers import LAYOUT_FILE, is_typed_snapshot, read_snapshot, write_snapshot
from docoutbox_spark.run import run_audit
from docoutbox_spark.schema import RAW_DEAD_LETTER_SCHEMA, TYPED_DOCUMENT_DDL
from tests.spark import planted
from tests.spark.test_audit import config, frame


def _raw_frames(spark: Any) -> dict[str, Any]:
    # Without the 14.5 MB document: the typed export of it is in test_cli's snapshot, and
    # several copies of it alive at once run the test session's 512 MB driver out of heap.
    return {
        "producer": frame(spark, planted.producer(big=False)),
        "consumer": frame(spark, planted.consumer()),
        "dead_letters": frame(spark, planted.dead_letters(), RAW_DEAD_LETTER_SCHEMA),
    }


def _audit(frames: dict[str, Any]) -> str:
    summary = run_audit(
        frames["producer"],
        consumer=frames["consumer"],
        dead_letters=frames["dead_letters"],
        config=config(),
    )
    return json.dumps(summary, sort_keys=True)


@pytest.fixture(scope="module")
def snapshots(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The planted collections audited as raw frames, and written as a typed snapshot and
    as a raw one (the layout snapshots had before the typed one)."""
    root = tmp_path_factory.mktemp("snapshots")
    raw = _raw_frames(spark)
    counts = write_snapshot(raw, root / "typed")
    for role, found in raw.items():
        found.write.parquet(str(root / "raw" / role))
    return {"root": root, "counts": counts, "direct": _audit(raw)}


def test_documents_are_written_typed_and_dead_letters_raw(
    spark: Any, snapshots: dict[str, Any]
) -> None:
    typed = snapshots["root"] / "typed"
    assert is_typed_snapshot(typed / "producer") and is_typed_snapshot(typed / "consumer")
    assert not (typed / "dead_letters" / LAYOUT_FILE).exists()
    frames = read_snapshot(spark, typed)
    assert is_typed(frames["producer"]) and is_typed(frames["consumer"])
    assert not is_typed(frames["dead_letters"])
    assert snapshots["counts"]["producer"] == len(planted.producer(big=False))


def test_the_typed_layout_is_the_declared_schema(spark: Any) -> None:
    written = typed_layout(frame(spark, planted.producer(big=False))).schema
    declared = StructType.fromDDL(TYPED_DOCUMENT_DDL)
    assert written.simpleString() == declared.simpleString()


def test_the_export_turns_only_documents_with_problems_into_json(spark: Any) -> None:
    # A conforming document's raw text is never built: a large state would cost its size
    # again in memory, for every document (the test session's driver ran out of heap).
    layout = typed_layout(frame(spark, planted.producer(big=False)))
    plan = layout._jdf.queryExecution().optimizedPlan().toString()
    guarded = r"CASE WHEN \(size\(problems#\d+, \w+\) > 0\) THEN invoke\(StructsToJsonEvaluator"
    assert plan.count("StructsToJsonEvaluator") == len(re.findall(guarded, plan)) == 1


def test_a_typed_snapshot_is_audited_as_its_raw_documents(
    spark: Any, snapshots: dict[str, Any]
) -> None:
    assert _audit(read_snapshot(spark, snapshots["root"] / "typed")) == snapshots["direct"]


def test_an_older_raw_snapshot_is_still_read_raw_and_audited_the_same(
    spark: Any, snapshots: dict[str, Any]
) -> None:
    frames = read_snapshot(spark, snapshots["root"] / "raw")
    assert not is_typed(frames["producer"]) and not is_typed(frames["consumer"])
    assert _audit(frames) == snapshots["direct"]


def test_a_typed_snapshot_exported_again_is_unchanged(
    spark: Any, snapshots: dict[str, Any], tmp_path: Path
) -> None:
    write_snapshot(read_snapshot(spark, snapshots["root"] / "typed"), tmp_path)
    assert is_typed_snapshot(tmp_path / "producer")
    assert _audit(read_snapshot(spark, tmp_path)) == snapshots["direct"]


def test_malformed_documents_keep_their_raw_text(spark: Any, snapshots: dict[str, Any]) -> None:
    producer = read_snapshot(spark, snapshots["root"] / "typed")["producer"]
    rows = {r["aggregate_id"]: r for r in producer.collect()}
    assert json.loads(rows["m-version"]["raw"])["version"] == "abc"
    assert json.loads(rows["m-outbox"]["raw"])["outbox"] == "oops"
    assert rows["m-missing"]["problems"] == ["type: missing", "outbox_seq: missing"]
    entry = rows["m-entry"]
    assert entry["raw"] is None  # the document conforms; one of its entries does not
    assert json.loads(entry["outbox_raw"][0])["seq"] == "x"
    assert entry["outbox"][0]["problems"] == ["payload: missing", "seq: not a positive integer"]
    clean = rows["w-ok-0"]
    assert clean["raw"] is None and clean["outbox_raw"] is None
    assert json.loads(clean["state"]) == {"balance": 10}
    assert [e["seq"] for e in clean["outbox"]] == [3]


def test_conforming_a_typed_snapshot_yields_the_raw_documents_frames(
    spark: Any, snapshots: dict[str, Any]
) -> None:
    raw = frame(spark, planted.producer(big=False))
    typed = read_snapshot(spark, snapshots["root"] / "typed")["producer"]

    def rows(found: Any) -> list[str]:
        return sorted(json.dumps(r.asDict(recursive=True), default=str) for r in found.collect())

    for part in ("documents", "entries", "malformed"):
        assert rows(getattr(conform(typed), part)) == rows(getattr(conform(raw), part)), part
