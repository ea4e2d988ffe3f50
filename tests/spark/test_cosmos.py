"""The planted documents as Cosmos DB items, read through the azure-cosmos data source (one
Spark partition per feed range): the same findings, exactly where planted."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.cosmos import CosmosClient, PartitionKey

from docoutbox_app.cli import main
from docoutbox_spark.audit import COSMOS_LIMIT
from docoutbox_spark.readers import CosmosTarget, read_cosmos
from docoutbox_spark.run import AuditConfig, run_audit
from tests.spark import planted
from tests.spark.test_audit import config
from tests.spark.test_cli import PLANTED_ARGS

BIG = 1_800_000  # above 80% of 2 MiB


def _account(request: pytest.FixtureRequest) -> tuple[str, str, dict[str, Any]]:
    try:
        account = request.getfixturevalue("cosmos_server")
    except pytest.FixtureLookupError:
        endpoint, key = os.environ.get("COSMOS_ENDPOINT"), os.environ.get("COSMOS_KEY")
        if not (endpoint and key):
            pytest.skip("no Cosmos DB server fixture in this tree and no COSMOS_ENDPOINT/KEY")
        kwargs = {"enable_endpoint_discovery": False} if endpoint.startswith("http://") else {}
        return endpoint, key, kwargs
    return account.endpoint, account.key, dict(account.client_kwargs)


def _json(value: Any) -> Any:
    def default(v: object) -> object:
        if isinstance(v, datetime):
            return v.replace(tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        raise TypeError(type(v).__name__)

    return json.loads(json.dumps(value, default=default))


ESCAPES = {"~": "~~", "/": "~s", "\\": "~b", "?": "~q", "#": "~h"}


def item(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as the Cosmos adapter stores it: an escaped ``id``, the ID as given in
    ``aid``, dates as ISO-8601 strings."""
    body = _json({k: v for k, v in doc.items() if k != "_id"})
    item_id = "".join(ESCAPES.get(ch, ch) for ch in str(doc["_id"]))
    return {**body, "id": item_id, "aid": doc["_id"]}


@pytest.fixture(scope="module")
def containers(request: pytest.FixtureRequest) -> Iterator[tuple[CosmosTarget, ...]]:
    pytest.importorskip("azure.cosmos", reason="azure-cosmos is not installed (cosmos extra)")

    endpoint, key, kwargs = _account(request)
    client = CosmosClient(endpoint, key, **kwargs)
    name = f"audit_{uuid.uuid4().hex[:8]}"
    db = client.create_database(name)
    try:
        targets = []
        producer = planted.producer(big=False)
        producer.append(planted.doc("w-big", 0, [], 4, state={"blob": "x" * BIG}))
        for role, docs in (
            ("producer", producer),
            ("consumer", planted.consumer()),
            ("dead", planted.dead_letters()),
        ):
            container = db.create_container(role, partition_key=PartitionKey(path="/id"))
            for doc in docs:
                container.create_item(item(doc))
            targets.append(
                CosmosTarget(
                    endpoint,
                    key,
                    name,
                    role,
                    verify=kwargs.get("connection_verify", True),
                    discovery=kwargs.get("enable_endpoint_discovery", True),
                )
            )
        yield tuple(targets)
    finally:
        client.delete_database(name)


def test_cosmos_datasource_finds_exactly_the_planted_anomalies(
    spark: Any, containers: tuple[CosmosTarget, ...]
) -> None:
    producer, consumer, dead = containers
    frame = read_cosmos(spark, producer, batch=7)
    base = config()
    summary = run_audit(
        frame,
        consumer=read_cosmos(spark, consumer),
        dead_letters=read_cosmos(spark, dead, kind="dead_letters"),
        expected_documents=len(planted.producer(big=False)) + 1,
        config=AuditConfig(**{**base.__dict__, "size_limit": COSMOS_LIMIT}),
    )
    assert summary["totals"]["documents"] == len(planted.producer(big=False)) + 1
    assert planted.reported(summary) == planted.EXPECTED
    big = summary["rows"]["near_size_limit"][0]
    assert big["size_exact"] and BIG < big["size_bytes"] < BIG + 2000


#: Any base64 key: the local server checks no signature. It must never be printed.
CLI_KEY = "YXVkaXQta2V5LXRoYXQtbXVzdC1uZXZlci1iZS1wcmludGVk"


def test_audit_and_export_read_cosmos_from_the_command_line(
    spark: Any,
    containers: tuple[CosmosTarget, ...],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = containers[0]
    monkeypatch.setenv("COSMOS_KEY", CLI_KEY)  # as a user keeps it out of the process list
    monkeypatch.delenv("COSMOS_CA_FILE", raising=False)
    common = [
        *("--cosmos-endpoint", producer.endpoint, "--database", producer.database),
        *("--container", "producer", "--consumer-container", "consumer"),
        *("--dead-letters", "dead"),
    ]
    summary = tmp_path / "audit.json"
    code = main(["audit", *common, "--size-limit", "cosmos", "--json", str(summary), *PLANTED_ARGS])
    assert code == 3  # the planted findings are above their thresholds
    found = json.loads(summary.read_text())
    assert planted.reported(found) == planted.EXPECTED
    assert found["source"]["reader"] == "cosmos"  # the default with --cosmos-endpoint
    assert found["totals"]["documents"] == len(planted.producer(big=False)) + 1

    snapshot = tmp_path / "snapshot"
    export = ["export", *common[:6], "--reader", "cosmos", "--progress-interval", "0"]
    assert main([*export, "--out", str(snapshot)]) == 0
    manifest = json.loads((snapshot / "manifest.json").read_text())
    assert manifest["counts"] == {"producer": len(planted.producer(big=False)) + 1}
    assert manifest["collection_counts"]["producer"] == manifest["counts"]["producer"]

    missing = [*common[:4], "--container", "no_such_container", "--progress-interval", "0"]
    assert main(["audit", *missing]) == 1
    out, err = capfd.readouterr()
    assert "docoutbox: error:" in err
    assert CLI_KEY not in out + err + summary.read_text()


def test_cosmos_reader_arguments_are_checked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COSMOS_ENDPOINT", raising=False)
    monkeypatch.delenv("COSMOS_KEY", raising=False)
    assert main(["audit", "--reader", "cosmos", "--database", "d", "--container", "c"]) == 2
    assert "--cosmos-endpoint" in capsys.readouterr().err
    endpoint = ["--cosmos-endpoint", "https://x/", "--cosmos-key", CLI_KEY]
    names = ["--database", "d", "--container", "c"]
    assert main(["audit", *endpoint, *names, "--reader", "datasource"]) == 2
    ca_file = ["--cosmos-ca-file", "/no/such.pem"]
    assert main(["export", *endpoint, *names, *ca_file, "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and CLI_KEY not in err
