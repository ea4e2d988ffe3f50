"""A PySpark Python data source over azure-cosmos: ``spark.read.format("docoutbox_cosmos")``.

Options: ``endpoint``, ``key``, ``database``, ``container``, ``kind`` (``documents`` or
``dead_letters``), ``batch`` (rows per Arrow batch, default 1000), ``ca_file`` (a PEM file
of the CA that signed an https endpoint's certificate, such as an emulator's self-signed
one), ``verify`` (``false`` to check no certificate at all), ``discovery`` (``false`` to
keep to the given endpoint, for local servers), ``partition_key_field`` (a partition-key
property that is not part of the document, if the container is not partitioned on ``/id``).

One Spark partition per feed range (``read_feed_ranges()``). Each reads its range's
latest-version change feed from the beginning, which returns every live item of the range
once, and yields Arrow batches of raw rows (:func:`docoutbox_spark.schema.raw_row`). An
item becomes a document as the Cosmos adapter stores it: ``_id`` from ``aid`` (else
``id``), without the service's properties; dates stay ISO-8601 strings, which the typed
schema parses. ``bson_size`` holds the item's JSON size, which Cosmos DB's 2 MB limit is
measured on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from docoutbox_spark.datasource import _arrow_schema, _batch, _schema
from docoutbox_spark.schema import raw_row

NAME = "docoutbox_cosmos"
SYSTEM_FIELDS = frozenset({"id", "aid", "_rid", "_self", "_etag", "_ts", "_attachments", "_lsn"})


@dataclass(frozen=True)
class FeedRange(InputPartition):  # type: ignore[misc]
    range: str  # the feed range, as JSON


def item_document(item: dict[str, Any], partition_key_field: str | None = None) -> dict[str, Any]:
    """The docoutbox document stored as ``item``."""
    doc: dict[str, Any] = {"_id": item["aid"] if "aid" in item else item.get("id")}
    for key, value in item.items():
        if key in SYSTEM_FIELDS or key == partition_key_field:
            continue
        doc[key] = value
    return doc


def item_size(item: dict[str, Any]) -> int:
    body = {k: v for k, v in item.items() if k not in SYSTEM_FIELDS - {"id"}}
    return len(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode())


def client_options(verify: bool, discovery: bool, ca_file: str | None) -> dict[str, Any]:
    """``CosmosClient`` options: certificate checks as in ``docoutbox dispatch``
    (:func:`docoutbox_cosmos.kit.tls_options`), endpoint discovery off for local servers."""
    from docoutbox_cosmos.clients import tls_options

    kwargs = tls_options(ca_file, insecure=not verify)
    if not discovery:
        kwargs["enable_endpoint_discovery"] = False
    return kwargs


class CosmosSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return _schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return CosmosReader(dict(self.options), schema)


class CosmosReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def _container(self) -> Any:
        from azure.cosmos import CosmosClient

        kwargs = client_options(
            self.options.get("verify", "true") != "false",
            self.options.get("discovery", "true") != "false",
            self.options.get("ca_file"),
        )
        client = CosmosClient(self.options["endpoint"], self.options["key"], **kwargs)
        database = client.get_database_client(self.options["database"])
        return database.get_container_client(self.options["container"])

    def partitions(self) -> list[FeedRange]:
        container = self._container()
        return [FeedRange(json.dumps(r)) for r in container.read_feed_ranges()]

    def read(self, partition: FeedRange) -> Iterator[Any]:
        import pyarrow as pa

        arrow_schema = _arrow_schema(self.schema)
        batch = int(self.options.get("batch", "1000"))
        pk_field = self.options.get("partition_key_field")
        rows: list[tuple[Any, ...]] = []
        container = self._container()
        feed = container.query_items_change_feed(
            feed_range=json.loads(partition.range), start_time="Beginning", max_item_count=batch
        )
        for item in feed:
            doc = item_document(item, pk_field)
            rows.append(raw_row(doc, self.schema, size=item_size(item)))
            if len(rows) >= batch:
                yield _batch(pa, arrow_schema, rows)
                rows = []
        if rows:
            yield _batch(pa, arrow_schema, rows)
