"""One SparkSession for the Spark tests (local[1], 512 MB, no UI), with the MongoDB
Spark connector jars of ``scripts/servers.sh install-spark``. Missing Java, pyspark or the
jars skip the Spark tests, or fail them when servers are required (CI)."""

from __future__ import annotations

import glob
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from tests.conftest import missing
from tests.spark import planted

JARS = Path(__file__).resolve().parents[1] / "servers" / "spark" / "lib"


def spark_missing() -> str | None:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"pyspark/pyarrow not installed ({exc}); run scripts/setup"
    if shutil.which("java") is None:
        return "java not found"
    if not glob.glob(str(JARS / "mongo-spark-connector_2.13-*.jar")):
        return (
            f"MongoDB Spark connector jars missing in {JARS}; run scripts/servers.sh install-spark"
        )
    return None


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    """The Spark tests' one session, ended with its gateway when they are done: a py4j
    thread left running would sleep inside the unit tier, which refuses a sleep."""
    reason = spark_missing()
    if reason:
        missing(reason)
    from docoutbox_spark.readers import session
    from tests.support.spark import end_session

    spark = session(jars=str(JARS), packages=False)
    yield spark
    end_session(spark)


@pytest.fixture(scope="session")
def planted_db(wire_server: Any) -> Any:
    """The planted collections in a scratch database, dropped at the session's end. No
    client stays open in between: its monitor threads would outlive the Spark tier and
    sleep inside the unit tier, whose guard refuses a sleep."""
    name = f"audit_{uuid.uuid4().hex[:8]}"
    with MongoClient(wire_server.uri) as client:
        db = client[name]
        db.producer.insert_many(planted.producer())
        db.consumer.insert_many(planted.consumer())
        db.dead.insert_many(planted.dead_letters())
    yield wire_server.uri, name
    with MongoClient(wire_server.uri) as client:
        client.drop_database(name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)
            # Audits are slow on a shared machine, and the cluster test starts a driver of
            # its own: allow for it.
            item.add_marker(pytest.mark.timeout(900))
