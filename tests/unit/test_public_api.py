"""The public surface is re-exported from docoutbox and stays free of database SDKs."""

from __future__ import annotations

import subprocess
import sys

import docoutbox

EXPECTED = {
    "Aggregate",
    "AggregateStore",
    "AsyncAggregateStore",
    "AsyncImmediateDispatcher",
    "AsyncLocalPublisher",
    "AsyncSettledPublisher",
    "AsyncStoreBackend",
    "BatchOutcome",
    "ConcurrencyConflict",
    "Created",
    "Decision",
    "DocOutboxError",
    "DocumentTooLarge",
    "Emit",
    "Failed",
    "Handler",
    "Handlers",
    "ImmediateDispatcher",
    "InboxPolicy",
    "InboxSaturated",
    "InvalidAggregateId",
    "InvalidHandlerResult",
    "InvalidInput",
    "InvalidMessage",
    "InvalidPayload",
    "LocalPublisher",
    "MalformedDocument",
    "Message",
    "NotFound",
    "Outcome",
    "OutboxMessage",
    "PermanentPublishError",
    "PermanentStoreError",
    "PublishError",
    "RetryPolicy",
    "Route",
    "SettledPublisher",
    "Snapshot",
    "Status",
    "StoreBackend",
    "StoreConfig",
    "StoreError",
    "TransientStoreError",
    "UnknownMessageType",
    "__version__",
    "emit",
    "partition_of",
}


def test_public_names() -> None:
    assert set(docoutbox.__all__) >= EXPECTED
    for name in docoutbox.__all__:
        assert hasattr(docoutbox, name), name


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
