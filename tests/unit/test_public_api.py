"""The public surface is re-exported from docoutbox and stays free of database SDKs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import docoutbox

#: The names a user needs, and no more: the rest is imported from its module.
EXPECTED = {
    "Aggregate",
    "AggregateStore",
    "AsyncAggregateStore",
    "AsyncDispatcher",
    "ConcurrencyConflict",
    "Context",
    "Decision",
    "Dispatcher",
    "DispatcherConfig",
    "DocOutboxError",
    "Emit",
    "Handlers",
    "InboxPolicy",
    "InvalidInput",
    "Message",
    "NotFound",
    "OutboxMessage",
    "Outcome",
    "PublishError",
    "RetryPolicy",
    "Status",
    "StoreConfig",
    "StoreError",
    "__version__",
    "emit",
}


def test_public_names() -> None:
    assert set(docoutbox.__all__) == EXPECTED
    assert len(docoutbox.__all__) <= 25
    for name in docoutbox.__all__:
        assert hasattr(docoutbox, name), name


ADAPTERS = [
    "docoutbox_mongo",
    "docoutbox_cosmos",
    "docoutbox_rabbitmq",
    "docoutbox_kafka",
    "docoutbox_spark",
]


@pytest.mark.parametrize("package", ADAPTERS)
def test_each_adapter_exports_at_most_eight_names(package: str) -> None:
    module = importlib.import_module(package)
    assert len(module.__all__) <= 8, module.__all__
    for name in module.__all__:
        assert hasattr(module, name), name


def test_every_error_derives_from_the_root() -> None:
    errors = [getattr(docoutbox, n) for n in docoutbox.__all__ if n.endswith(("Error", "Found"))]
    assert errors
    assert all(issubclass(e, docoutbox.DocOutboxError) for e in errors)


def test_core_imports_no_database_or_broker_sdk() -> None:
    code = (
        "import sys, importlib, pkgutil, docoutbox;"
        "[importlib.import_module(m.name) for m in"
        " pkgutil.walk_packages(docoutbox.__path__, 'docoutbox.')"
        " if not m.name.endswith('__main__')];"
        "bad = {'pymongo', 'bson', 'motor', 'pika', 'aio_pika', 'azure', 'pyspark',"
        " 'confluent_kafka', 'aiokafka'}"
        " & {m.split('.')[0] for m in sys.modules};"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
