"""Claim-checked entries in the audit: a reference instead of a payload is not malformed,
and the payload's size comes from the reference."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox_spark import audit
from docoutbox_spark.conform import conform
from docoutbox_spark.schema import RAW_DOCUMENT_SCHEMA, raw_row
from tests.spark import planted

pytestmark = pytest.mark.spark


def test_a_claim_checked_entry_is_sized_from_its_reference(spark: Any) -> None:
    claimed = planted.entry("w-big", 1)
    del claimed["payload"]
    claimed["claim"] = {"id": "3f1c", "size": 5_000_000, "encoded": False}
    docs = [
        planted.doc("w-big", 1, [claimed], 1),
        planted.doc("w-small", 1, [planted.entry("w-small", 1)], 2),
    ]
    raw = spark.createDataFrame(
        [raw_row(d, RAW_DOCUMENT_SCHEMA) for d in docs], RAW_DOCUMENT_SCHEMA
    )
    conformed = conform(raw)
    assert conformed.malformed.count() == 0
    rows = {r.aggregate_id: r for r in conformed.entries.collect()}
    assert rows["w-big"].claimed and rows["w-big"].payload_bytes == 5_000_000
    assert not rows["w-small"].claimed and rows["w-small"].payload_bytes == len('{"amount":1}')
    (sizes,) = audit.payload_sizes(conformed.entries).collect()
    assert (sizes.entries, sizes.claimed, sizes.max) == (2, 1, 5_000_000)
