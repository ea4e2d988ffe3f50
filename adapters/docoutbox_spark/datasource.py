"""A PySpark Python data source over pymongo: ``spark.read.format("docoutbox_mongo")``.

Options: ``uri``, ``database``, ``collection``, ``partitions`` (default 4), ``batch``
(rows per Arrow batch, default 1000), ``kind`` (``documents`` or ``dead_letters``: which
raw schema to produce).

The driver lists the ``_id``s in order and cuts them into ranges (``$gte``/``$lte`` on
``_id``), one per Spark partition. Ranges never mix BSON type classes, because a range
query only matches values of its bounds' type (a string range never returns an integer
``_id``). IDs of other types go into an ``$in`` partition. Each partition opens its own
client inside ``read()`` (readers are pickled to the workers) and yields Arrow record
batches of raw rows (:func:`docoutbox_spark.schema.raw_row`) with each document's exact
BSON size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from docoutbox_spark.schema import (
    RAW_ARCHIVE_SCHEMA,
    RAW_DEAD_LETTER_SCHEMA,
    RAW_DOCUMENT_SCHEMA,
    raw_row,
)

NAME = "docoutbox_mongo"


@dataclass(frozen=True)
class IdRange(InputPartition):  # type: ignore[misc]
    """Documents whose ``_id`` is in ``[lo, hi]`` (same type class), or in ``ids``."""

    lo: Any = None
    hi: Any = None
    ids: tuple[Any, ...] | None = None

    def filter(self) -> dict[str, Any]:
        if self.ids is not None:
            return {"_id": {"$in": list(self.ids)}}
        return {"_id": {"$gte": self.lo, "$lte": self.hi}}


def _type_class(value: Any) -> str | None:
    """The BSON comparison class of a range bound, or None for IDs listed with $in."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, datetime):
        return "date"
    name = type(value).__name__
    if name == "ObjectId":
        return "objectid"
    if name == "Decimal128":
        return "number"
    return None


def plan_ranges(sorted_ids: list[Any], partitions: int) -> list[IdRange]:
    """Cut ``_id``s (in the server's sort order) into about ``partitions`` ranges."""
    partitions = max(1, partitions)
    size = max(1, -(-len(sorted_ids) // partitions))
    groups: list[tuple[str | None, list[Any]]] = []
    for value in sorted_ids:
        cls = _type_class(value)
        if groups and groups[-1][0] == cls:
            groups[-1][1].append(value)
        else:
            groups.append((cls, [value]))
    if not groups:
        # Spark reads a source without partitions through one bare InputPartition,
        # which has no filter: an empty collection is one partition matching nothing.
        return [IdRange(ids=())]
    ranges: list[IdRange] = []
    for cls, ids in groups:
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            if cls is None:
                ranges.append(IdRange(ids=tuple(chunk)))
            else:
                ranges.append(IdRange(lo=chunk[0], hi=chunk[-1]))
    return ranges


class MongoSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return _schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MongoReader(dict(self.options), schema)


def _schema(options: dict[str, str]) -> StructType:
    kind = options.get("kind", "documents")
    if kind == "dead_letters":
        return RAW_DEAD_LETTER_SCHEMA
    if kind == "inbox_archive":  # docoutbox_spark.spilled
        return RAW_ARCHIVE_SCHEMA
    if kind != "documents":
        raise ValueError(f"unknown kind {kind!r} (documents, dead_letters or inbox_archive)")
    return RAW_DOCUMENT_SCHEMA


class MongoReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def _collection(self, client: Any) -> Any:
        return client[self.options["database"]][self.options["collection"]]

    def _client(self, **kwargs: Any) -> Any:
        from pymongo import MongoClient

        return MongoClient(self.options["uri"], **kwargs)

    def partitions(self) -> list[IdRange]:
        with self._client() as client:
            cursor = self._collection(client).find({}, {"_id": 1}, batch_size=10_000).sort("_id", 1)
            ids = [doc["_id"] for doc in cursor]
        return plan_ranges(ids, int(self.options.get("partitions", "4")))

    def read(self, partition: IdRange) -> Iterator[Any]:
        import pyarrow as pa
        from bson import decode
        from bson.raw_bson import RawBSONDocument

        arrow_schema = _arrow_schema(self.schema)
        batch = int(self.options.get("batch", "1000"))
        rows: list[tuple[Any, ...]] = []
        with self._client(document_class=RawBSONDocument) as client:
            cursor = self._collection(client).find(partition.filter(), batch_size=batch)
            for raw in cursor:
                data = raw.raw
                rows.append(raw_row(decode(data), self.schema, size=len(data)))
                if len(rows) >= batch:
                    yield _batch(pa, arrow_schema, rows)
                    rows = []
        if rows:
            yield _batch(pa, arrow_schema, rows)


def _arrow_schema(schema: StructType) -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(f.name, pa.int64() if f.dataType.typeName() == "long" else pa.string())
            for f in schema.fields
        ]
    )


def _batch(pa: Any, schema: Any, rows: list[tuple[Any, ...]]) -> Any:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
        schema=schema,
    )
