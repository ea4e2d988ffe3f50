"""Ways into the audit: the MongoDB Spark connector, the pymongo data source, Parquet.

Every database reader returns raw rows (:data:`~docoutbox_spark.schema.RAW_DOCUMENT_SCHEMA`
or :data:`~docoutbox_spark.schema.RAW_DEAD_LETTER_SCHEMA`); :mod:`docoutbox_spark.conform`
applies the typed schema. A Parquet snapshot keeps the documents typed
(:data:`~docoutbox_spark.schema.TYPED_DOCUMENT_DDL`), so its audit conforms nothing.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from py4j.clientserver import FinalizerWorker
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from docoutbox_spark.conform import typed_layout
from docoutbox_spark.cosmos_source import NAME as COSMOS
from docoutbox_spark.cosmos_source import CosmosSource
from docoutbox_spark.datasource import NAME, MongoSource
from docoutbox_spark.schema import (
    RAW_ARCHIVE_SCHEMA,
    RAW_DEAD_LETTER_SCHEMA,
    RAW_DOCUMENT_SCHEMA,
    TYPED_DOCUMENT_DDL,
)

CONNECTOR = "org.mongodb.spark:mongo-spark-connector_2.13:10.5.0"
PARTITIONER = "com.mongodb.spark.sql.connector.read.partitioner.PaginateIntoPartitionsPartitioner"
READERS = ("connector", "datasource")


#: log4j2 settings that keep Spark's own lines (WARN and below) out of the user's output.
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")


def session_config(
    *,
    jars: str | None = None,
    master: str = "local[1]",
    memory: str = "512m",
    packages: bool = True,
    verbose: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The configuration of a new audit session (see :func:`session`)."""
    config = {
        "spark.master": master,
        "spark.app.name": "docoutbox-audit",
        "spark.driver.memory": memory,
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "true" if verbose else "false",
    }
    if not verbose:
        config["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}"
        )
    jar_list = _jars(jars)
    if jar_list:
        config["spark.jars"] = ",".join(jar_list)
    elif packages:
        config["spark.jars.packages"] = CONNECTOR
    config.update(extra or {})
    return config


def session(
    *,
    jars: str | None = None,
    master: str = "local[1]",
    memory: str = "512m",
    packages: bool = True,
    verbose: bool = False,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the audit.

    An active session (one made by ``spark-submit``, a notebook or a cluster) is used as
    it is: its configuration is left alone. Otherwise a new one is made with
    :func:`session_config`. ``jars``: a directory of jars (or a comma-separated list)
    holding the MongoDB Spark connector; without it, the connector is resolved from Maven
    Central (``spark.jars.packages``) unless ``packages`` is False: only the connector
    reader needs it, so the data sources and Parquet pass False and touch no network.
    Shuffle partitions are left to adaptive query execution. Spark's own log lines and
    progress bar are shown only when ``verbose``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = SparkSession.getActiveSession()
    if spark is None:
        builder = SparkSession.builder
        config = session_config(
            jars=jars, master=master, memory=memory, packages=packages, verbose=verbose, extra=extra
        )
        for key, value in config.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    spark.dataSource.register(MongoSource)
    spark.dataSource.register(CosmosSource)
    return spark


#: How long the JVM and py4j's finalizer worker may take to end (the worker sleeps 1 s).
ENDING_TIMEOUT = 60.0


def end_session(spark: SparkSession, timeout: float = ENDING_TIMEOUT) -> list[str]:
    """Stop ``spark`` and the py4j gateway it runs on; return the names of the py4j
    threads still running ``timeout`` seconds later (none: everything ended).

    ``SparkSession.stop()`` stops the SparkContext but keeps the gateway: its JVM, and
    py4j's ``FinalizerWorker`` thread, which sleeps a second whenever it is idle. This
    also shuts the gateway down, waits for the JVM to exit and the worker to end, and
    forgets the gateway, so that a later :func:`session` starts a new one. Call it only
    for a session this process made (:func:`session` with no session active), never for
    one it was handed (``spark-submit``, a notebook): their gateway is their owner's."""
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return []
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the JVM exits when its stdin ends
        proc.wait(timeout=timeout)
    workers = [t for t in threading.enumerate() if isinstance(t, FinalizerWorker)]
    for worker in workers:
        worker.join(timeout=timeout)
    SparkContext._gateway = None
    SparkContext._jvm = None
    return [t.name for t in workers if t.is_alive()]


def _jars(jars: str | None) -> list[str]:
    if not jars:
        return []
    if os.path.isdir(jars):
        return sorted(glob.glob(os.path.join(jars, "*.jar")))
    return [j for j in jars.split(",") if j]


@dataclass(frozen=True)
class MongoTarget:
    uri: str
    database: str
    collection: str


def read_connector(
    spark: SparkSession,
    target: MongoTarget,
    schema: StructType = RAW_DOCUMENT_SCHEMA,
    partitions: int = 4,
) -> DataFrame:
    """Read through the official MongoDB Spark connector with the raw schema and the
    ``PaginateIntoPartitionsPartitioner`` (the one that needs no ``$collStats``)."""
    return (
        spark.read.format("mongodb")
        .schema(schema)
        .option("connection.uri", target.uri)
        .option("database", target.database)
        .option("collection", target.collection)
        .option("partitioner", PARTITIONER)
        .option("partitioner.options.max.number.of.partitions", str(partitions))
        .load()
    )


def read_datasource(
    spark: SparkSession, target: MongoTarget, kind: str = "documents", partitions: int = 4
) -> DataFrame:
    """Read through the project's pymongo data source (``_id`` ranges, Arrow batches)."""
    return (
        spark.read.format(NAME)
        .option("uri", target.uri)
        .option("database", target.database)
        .option("collection", target.collection)
        .option("kind", kind)
        .option("partitions", str(partitions))
        .load()
    )


def read_mongo(
    spark: SparkSession,
    target: MongoTarget,
    reader: str,
    dead_letters: bool = False,
    partitions: int = 4,
) -> DataFrame:
    if reader == "connector":
        schema = RAW_DEAD_LETTER_SCHEMA if dead_letters else RAW_DOCUMENT_SCHEMA
        return read_connector(spark, target, schema, partitions)
    if reader == "datasource":
        kind = "dead_letters" if dead_letters else "documents"
        return read_datasource(spark, target, kind, partitions)
    raise ValueError(f"unknown reader {reader!r}: one of {', '.join(READERS)}")


@dataclass(frozen=True)
class CosmosTarget:
    endpoint: str
    key: str
    database: str
    container: str
    verify: bool = True
    discovery: bool = True
    #: PEM file of the CA that signed an https endpoint's certificate (an emulator's).
    ca_file: str | None = None


def read_cosmos(
    spark: SparkSession, target: CosmosTarget, kind: str = "documents", batch: int = 1000
) -> DataFrame:
    """Read a Cosmos DB container through the project's azure-cosmos data source (one
    partition per feed range)."""
    reader = spark.read.format(COSMOS)
    if target.ca_file:
        reader = reader.option("ca_file", target.ca_file)
    return (
        reader.option("endpoint", target.endpoint)
        .option("key", target.key)
        .option("database", target.database)
        .option("container", target.container)
        .option("kind", kind)
        .option("batch", str(batch))
        .option("verify", str(target.verify).lower())
        .option("discovery", str(target.discovery).lower())
        .load()
    )


def count_items(target: CosmosTarget) -> int:
    """The container's item count, read apart from Spark, to prove none went unread."""
    from azure.cosmos import CosmosClient

    from docoutbox_cosmos.errors import translated
    from docoutbox_spark.cosmos_source import client_options

    options = client_options(target.verify, target.discovery, target.ca_file)
    with translated(), CosmosClient(target.endpoint, target.key, **options) as client:
        container = client.get_database_client(target.database).get_container_client(
            target.container
        )
        counts = container.query_items(
            "SELECT VALUE COUNT(1) FROM c", enable_cross_partition_query=True
        )
        return int(sum(counts))


def count_documents(target: MongoTarget) -> int:
    """The collection's document count, read apart from Spark, to prove none went unread."""
    from pymongo import MongoClient

    with MongoClient(target.uri) as client:
        return int(client[target.database][target.collection].count_documents({}))


# Parquet snapshot: one directory per role. The documents' roles are written typed (see
# :func:`write_snapshot`); dead letters and archives stay raw rows.
ROLES = ("producer", "consumer", "dead_letters", "consumer_archive")
#: The roles written in the typed layout.
TYPED_ROLES = ("producer", "consumer")
#: The file that marks a role's directory as the typed layout (Spark skips files whose
#: name starts with ``_`` when it reads the directory).
LAYOUT_FILE = "_docoutbox_layout"
TYPED_LAYOUT = "typed-documents 1"


def write_snapshot(frames: dict[str, DataFrame], directory: str | Path) -> dict[str, int]:
    """Write each role's frame to ``directory/<role>`` as Parquet; return row counts.

    The producer and consumer documents are written in the typed layout
    (:func:`~docoutbox_spark.conform.typed_layout`): typed once here, so an audit of the
    snapshot parses no JSON and types nothing. A document or entry that does not conform
    keeps its raw text beside its typed fields and its problems, and is reported as from
    the database. Raw frames and typed ones (a snapshot read back) are both accepted."""
    counts: dict[str, int] = {}
    for role, frame in frames.items():
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        path = Path(directory) / role
        typed = role in TYPED_ROLES
        (typed_layout(frame) if typed else frame).write.mode("overwrite").parquet(str(path))
        if typed:
            (path / LAYOUT_FILE).write_text(TYPED_LAYOUT + "\n")
        counts[role] = spark_count(frame.sparkSession.read.parquet(str(path)))
    return counts


def is_typed_snapshot(path: str | Path) -> bool:
    """Whether a role's directory holds the typed layout (older snapshots hold raw rows)."""
    marker = Path(path) / LAYOUT_FILE
    return marker.is_file() and marker.read_text().strip() == TYPED_LAYOUT


def read_snapshot(spark: SparkSession, directory: str | Path) -> dict[str, DataFrame]:
    """The roles present under ``directory`` (at least ``producer``), each with its
    explicit schema: the typed layout where the role's directory is marked so, raw rows
    otherwise (snapshots written before the typed layout), which the audit conforms."""
    found: dict[str, DataFrame] = {}
    for role in ROLES:
        path = Path(directory) / role
        if path.is_dir():
            schema: StructType | str = {
                "dead_letters": RAW_DEAD_LETTER_SCHEMA,
                "consumer_archive": RAW_ARCHIVE_SCHEMA,
            }.get(role, RAW_DOCUMENT_SCHEMA)
            if role in TYPED_ROLES and is_typed_snapshot(path):
                schema = TYPED_DOCUMENT_DDL
            found[role] = spark.read.schema(schema).parquet(str(path))
    return found


def spark_count(frame: DataFrame) -> int:
    return int(frame.count())


def options_of(target: MongoTarget) -> dict[str, Any]:
    return {"uri": target.uri, "database": target.database, "collection": target.collection}
