"""Stored values in the readers' frames: decoded and upcast where a caller needs them.

Rule: the audit reads metadata only, so it runs on encoded documents as they are; a
caller that needs the values (an export in plain form, a query on payloads or states)
opens the raw rows with :func:`open_values` and the codec and upcasters of the stores
(:class:`docoutbox.stored.StoredValues`), before :func:`~docoutbox_spark.conform.conform`.
The raw ``state`` and ``outbox`` columns are rewritten, as JSON text, by the same code the
store reads with; every other column is left as it is. A value that does not decode fails
the job with the error and the document's ID: nothing is dropped or passed on encoded.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from docoutbox.errors import DocOutboxError
from docoutbox.stored.upcast import STATE_VERSION
from docoutbox.stored.values import StoredValues


def open_values(raw: DataFrame, values: StoredValues) -> DataFrame:
    """``raw`` document rows (:data:`~docoutbox_spark.schema.RAW_DOCUMENT_SCHEMA`, or a
    snapshot of them) with each state and entry decoded and upcast, as JSON text."""
    names = ("_id", "type", "state", "outbox", STATE_VERSION)
    present = set(raw.columns)

    def opened(*cells: Any) -> tuple[Any, Any]:
        row = open_row(dict(zip(names, cells, strict=True)), values)
        return row.get("state"), row.get("outbox")

    udf = F.udf(opened, _OPENED, useArrow=False)
    cells = [F.col(n) if n in present else F.lit(None).cast("string") for n in names]
    columns = ["state", "outbox"]
    result = raw.withColumn("_opened", udf(*cells))
    for name in columns:
        if name in present:
            result = result.withColumn(name, F.col("_opened")[name])
    return result.drop("_opened")


_OPENED = StructType([StructField("state", StringType()), StructField("outbox", StringType())])


def open_row(row: dict[str, Any], values: StoredValues) -> dict[str, Any]:
    """One raw row (strings: JSON text or an encoded value) with ``state`` and ``outbox``
    opened. A row whose ``state`` or ``outbox`` is not JSON is left for ``conform`` to
    report; a value that does not decode or upcast raises, naming the document."""
    opened = dict(row)
    try:
        state = row.get("state")
        if state is not None:
            stored = state if state.startswith("dx1:") else _json(state)
            if stored is not None:
                doc = {
                    "_id": row.get("_id"),
                    "state": stored,
                    STATE_VERSION: _version(row.get(STATE_VERSION)),
                }
                opened["state"] = _text(values.open_state(str(row.get("type")), doc))
        outbox = _json(row.get("outbox"))
        if isinstance(outbox, list):
            entries = [values.open_entry(e) if isinstance(e, dict) else e for e in outbox]
            opened["outbox"] = _text(entries)
    except DocOutboxError as exc:
        raise type(exc)(f"document {row.get('_id')!r}: {exc}") from exc
    return opened


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _version(text: Any) -> Any:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return text  # refused by the upcasters, naming it


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
