"""The one explicit schema of a stored aggregate document, and its raw reading form.

:data:`DOCUMENT_SCHEMA` is the layout of :mod:`docoutbox.store.document` as Spark types, with
``payload`` and ``headers`` kept as JSON strings because they differ per message type.

Readers never apply it directly: a document that does not match it (a missing field, a
wrong type, an outbox that is not an array) would fail the whole job in the MongoDB Spark
connector. They read :func:`raw_schema` instead, the same top-level fields as strings
(nested values as JSON text), plus ``bson_size`` when the reader knows the exact stored
size. :func:`docoutbox_spark.conform.conform` then applies the typed schema and turns every
mismatch into a finding that names the document. A Parquet snapshot stores the result of
that step (:data:`TYPED_DOCUMENT_DDL`), so its audit repeats none of it.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

ENTRY_SCHEMA = StructType(
    [
        StructField("id", StringType(), False),
        StructField("type", StringType(), False),
        StructField("payload", StringType(), False),  # JSON object text
        StructField("headers", StringType(), True),  # JSON object text
        StructField("created_at", TimestampType(), False),
        StructField("seq", LongType(), False),
        StructField("aggregate_id", StringType(), False),
        StructField("aggregate_type", StringType(), False),
        StructField("correlation_id", StringType(), True),
        StructField("causation_id", StringType(), True),
        StructField("destination", StringType(), True),
        StructField("attempts", LongType(), True),
        StructField("last_error", StringType(), True),
    ]
)

MARK_SCHEMA = StructType(
    [
        StructField("source", StringType(), False),
        StructField("hw", LongType(), False),
        StructField("above", ArrayType(LongType()), True),
    ]
)

DOCUMENT_SCHEMA = StructType(
    [
        StructField("_id", StringType(), False),
        StructField("type", StringType(), False),
        StructField("version", LongType(), False),
        StructField("partition", LongType(), True),
        StructField("state", StringType(), True),  # JSON object text
        StructField("inbox", ArrayType(StringType()), True),
        StructField("inbox_marks", ArrayType(MARK_SCHEMA), True),
        StructField("outbox", ArrayType(ENTRY_SCHEMA), False),
        StructField("outbox_seq", LongType(), False),
        StructField("created_at", TimestampType(), True),
        StructField("updated_at", TimestampType(), True),
        # The model version of ``state``, for upcasting (docoutbox.stored); usually absent.
        StructField("state_version", LongType(), True),
    ]
)

DEAD_LETTER_SCHEMA = StructType(
    [
        StructField("_id", StringType(), False),
        StructField("aggregate_id", StringType(), True),
        StructField("entry", ENTRY_SCHEMA, True),
        StructField("error", StringType(), True),
        StructField("attempts", LongType(), True),
        StructField("quarantined_at", TimestampType(), True),
    ]
)

SIZE_FIELD = "bson_size"


def raw_schema(typed: StructType) -> StructType:
    """``typed``'s top-level fields as nullable strings, plus the ``bson_size`` column."""
    fields = [StructField(f.name, StringType(), True) for f in typed.fields]
    return StructType([*fields, StructField(SIZE_FIELD, LongType(), True)])


RAW_DOCUMENT_SCHEMA = raw_schema(DOCUMENT_SCHEMA)
RAW_DEAD_LETTER_SCHEMA = raw_schema(DEAD_LETTER_SCHEMA)

#: A row of a spilling inbox's archive (:mod:`docoutbox_spark.spilled`).
ARCHIVE_SCHEMA = StructType(
    [
        StructField("_id", StringType(), True),
        StructField("aggregate_id", StringType(), True),
        StructField("message_id", StringType(), True),
    ]
)
RAW_ARCHIVE_SCHEMA = raw_schema(ARCHIVE_SCHEMA)


def _iso(value: datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def _plain(value: Any) -> Any:
    """``value`` as plain JSON data, the way the MongoDB Spark connector renders it."""
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # ObjectId, UUID, Decimal128, Binary ...


def raw_value(value: Any) -> str | None:
    """One top-level field as the string the connector yields for a ``StringType`` field:
    strings as they are, other scalars as text, documents and arrays as JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)
    plain = _plain(value)
    return plain if isinstance(plain, str) else json.dumps(plain)


def raw_row(doc: dict[str, Any], schema: StructType, size: int | None = None) -> tuple[Any, ...]:
    """A stored document as a row of ``schema`` (a :func:`raw_schema`)."""
    values: list[Any] = []
    for field in schema.fields:
        if field.name == SIZE_FIELD:
            values.append(size)
        else:
            values.append(raw_value(doc.get(field.name)))
    return tuple(values)


def field_type(schema: StructType, name: str) -> DataType:
    return schema[name].dataType


#: A typed outbox entry, as :func:`docoutbox_spark.conform.typed_layout` writes it: the
#: entry's typed fields, its problems, and its payload's stored size.
TYPED_ENTRY_DDL = (
    "struct<position:int,id:string,type:string,destination:string,payload:string,"
    "headers:string,created_at:timestamp,due:timestamp,seq:bigint,entry_aggregate_id:string,"
    "entry_aggregate_type:string,attempts:bigint,last_error:string,problems:array<string>,"
    "payload_bytes:bigint,claimed:boolean>"
)
#: The typed layout of a snapshot's documents (:mod:`docoutbox_spark.readers`): typed
#: top-level fields, the outbox as typed entries, the per-document problems, the figures
#: every audit needs (size, pending entries, seqs), the stored state, and the raw text of
#: what did not conform (``raw``, ``outbox_raw``).
TYPED_DOCUMENT_DDL = ", ".join(
    [
        "aggregate_id string",
        "type string",
        "version bigint",
        "`partition` bigint",
        "inbox array<string>",
        "inbox_marks array<struct<source:string,hw:bigint,above:array<bigint>>>",
        "outbox_seq bigint",
        "created_at timestamp",
        "updated_at timestamp",
        "size_bytes bigint",
        "size_exact boolean",
        f"outbox array<{TYPED_ENTRY_DDL}>",
        "pending int",
        "seqs array<bigint>",
        "problems array<string>",
        "state string",
        "state_version string",
        "raw string",
        "outbox_raw array<string>",
    ]
)
