"""A boolean where a counter belongs is a malformed document, read directly or from a
typed snapshot: never the number a cast of ``true`` would give (Spark casts a boolean to
1), never silently null."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docoutbox_spark.conform import conform
from docoutbox_spark.readers import read_snapshot, write_snapshot
from tests.spark import planted
from tests.spark.test_audit import frame


def _documents() -> list[dict[str, Any]]:
    """One document per counter holding ``true``; ``ok`` holds none."""
    entry = planted.entry

    def doc(agg: str, entries: list[dict[str, Any]] | None = None, **extra: Any) -> Any:
        return planted.doc(agg, 1, entries if entries is not None else [entry(agg, 1)], 0, **extra)

    mark = {"source": "s", "hw": 1, "above": [3]}
    return [
        doc("ok", inbox_marks=[mark], state_version=2),
        doc("version", version=True),
        {**doc("outbox_seq"), "outbox_seq": True},
        {**doc("partition"), "partition": True},
        doc("state_version", state_version=True),
        doc("hw", inbox_marks=[{**mark, "hw": True}]),
        doc("above", inbox_marks=[{**mark, "above": [3, True]}]),
        doc("seq", [{**entry("seq", 1), "seq": True}]),
        doc("attempts", [entry("attempts", 1, attempts=True)]),
    ]


EXPECTED = {
    "version": "version: not an integer",
    "outbox_seq": "outbox_seq: not an integer",
    "partition": "partition: not an integer",
    "state_version": "state_version: not an integer",
    "hw": "inbox_marks: an element is not {source, hw, above}",
    "above": "inbox_marks: an element is not {source, hw, above}",
    "seq": "outbox[0]: seq: not a positive integer",
    "attempts": "outbox[0]: attempts: not an integer",
}


def _reported(found: Any) -> dict[str, str]:
    return {r["aggregate_id"]: r["detail"] for r in found.malformed.collect()}


def test_a_boolean_counter_is_malformed_directly_and_in_a_typed_snapshot(
    spark: Any, tmp_path: Path
) -> None:
    raw = frame(spark, _documents())
    assert _reported(conform(raw)) == EXPECTED
    write_snapshot({"producer": raw}, tmp_path)
    snapshot = conform(read_snapshot(spark, tmp_path)["producer"])
    assert _reported(snapshot) == EXPECTED
    typed = {r["aggregate_id"]: r for r in snapshot.documents.collect()}
    assert typed["version"]["version"] is None and typed["ok"]["version"] == 2
    assert typed["outbox_seq"]["outbox_seq"] is None and typed["ok"]["outbox_seq"] == 1
