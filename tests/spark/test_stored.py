"""The audit and the export over stored values: on encrypted documents the audit reports
exactly what it reports on plain ones (backlog, stuck entries, gaps...); the readers open
encrypted, old-version documents into the current model; ``docoutbox export`` writes values
as stored by default and decoded with ``--decode``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox import Aggregate, AggregateStore, Decision, Message, StoreConfig, emit
from docoutbox.stored import AesGcm, Codec, Keyring, StoredValues, Upcasters, Zlib
from docoutbox_app.cli import main
from docoutbox_mongo import MongoBackend
from docoutbox_spark.conform import conform
from docoutbox_spark.readers import read_snapshot
from docoutbox_spark.run import run_audit
from docoutbox_spark.schema import RAW_DOCUMENT_SCHEMA, raw_row
from docoutbox_spark.stored import open_values
from tests.spark import planted
from tests.spark.test_audit import config, frame

CODEC = Codec(Zlib(), AesGcm(Keyring({"k1": bytes(range(32))}, current="k1")))
SEALED = StoredValues(CODEC)


def upcasters() -> Upcasters:
    found = Upcasters()

    @found.state("Wallet", 1)
    def cents(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["balance"] * 100}

    @found.payload("Credited", 1)
    def credited_cents(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"] * 100}

    return found


#: What ``docoutbox export --decode tests.spark.test_stored:CURRENT`` decodes with.
CURRENT = StoredValues(CODEC, upcasters())


def sealed(doc: dict[str, Any]) -> dict[str, Any]:
    """A planted document as a store with :data:`CODEC` would hold it."""
    out = dict(doc)
    if isinstance(doc.get("state"), dict):
        out["state"], _ = SEALED.seal_state(doc["type"], doc["_id"], doc["state"])
    if isinstance(doc.get("outbox"), list):
        out["outbox"] = [
            SEALED.seal_entry(e) if isinstance(e, dict) and "payload" in e else e
            for e in doc["outbox"]
        ]
    return out


def test_the_audit_reports_the_same_findings_on_encrypted_documents(spark: Any) -> None:
    producer = [sealed(d) for d in planted.producer(big=False)]
    text = json.dumps(producer, default=str)
    assert '"amount"' not in text and "traceparent" not in text and '"balance"' not in text
    summary = run_audit(
        frame(spark, producer),
        consumer=frame(spark, [sealed(d) for d in planted.consumer()]),
        expected_documents=len(producer),
        config=config(),
    )
    plain = run_audit(
        frame(spark, planted.producer(big=False)),
        consumer=frame(spark, planted.consumer()),
        expected_documents=len(producer),
        config=config(),
    )
    found = planted.reported(summary)
    assert found == planted.reported(plain)
    for kind in ("stuck", "seq_gap", "retrying", "malformed", "lost"):
        assert found[kind], kind  # backlog, stuck entries and gaps are still seen
    assert summary["rows"]["malformed"] == plain["rows"]["malformed"]
    assert summary["totals"] == plain["totals"]


def test_the_readers_open_encrypted_old_documents_as_the_current_model(spark: Any) -> None:
    docs = [
        sealed(planted.doc("a", 2, [planted.entry("a", 1), planted.entry("a", 2)], 0)),
        planted.doc("b", 1, [planted.entry("b", 1)], 0, state={"cents": 7}, state_version=2),
    ]
    opened = conform(open_values(frame(spark, docs), CURRENT))
    payloads = sorted(
        (r.aggregate_id, r.seq, json.loads(r.payload), json.loads(r.headers))
        for r in opened.entries.collect()
    )
    trace = {"traceparent": "00-abc-def-01"}
    assert payloads == [
        ("a", 1, {"cents": 100}, trace),
        ("a", 2, {"cents": 200}, trace),
        ("b", 1, {"cents": 100}, trace),
    ]
    assert opened.malformed.count() == 0
    states = open_values(frame(spark, docs), CURRENT).select("_id", "state").collect()
    assert {r["_id"]: json.loads(r["state"]) for r in states} == {
        "a": {"cents": 1000},
        "b": {"cents": 7},
    }


class Wallet(Aggregate):
    balance: int = 0


def credit(wallet: Wallet, message: Message) -> Decision[Wallet]:
    amount = int(str(message.payload["amount"]))
    return Decision(Wallet(balance=wallet.balance + amount), emit("Credited", {"amount": amount}))


@pytest.fixture
def encrypted_db(wire_server: Any) -> Iterator[tuple[str, str]]:
    client: Any = MongoClient(wire_server.uri)
    name = f"stored_{uuid.uuid4().hex[:8]}"
    store = AggregateStore(MongoBackend(client[name]["wallets"]), Wallet, StoreConfig(codec=CODEC))
    for i in range(3):
        message = Message(id=f"m-{i}", type="Credit", payload={"amount": i + 1})
        store.handle(f"w-{i}", message, credit, create=True)
    yield wire_server.uri, name
    client.drop_database(name)
    client.close()


def test_export_keeps_values_encoded_unless_asked_to_decode(
    spark: Any, encrypted_db: tuple[str, str], tmp_path: Any
) -> None:
    uri, db = encrypted_db
    common = ["export", "--mongo-uri", uri, "--db", db, "--collection", "wallets"]
    common += ["--reader", "datasource", "--progress-interval", "0"]
    assert main([*common, "--out", str(tmp_path / "raw")]) == 0
    stored = read_snapshot(spark, tmp_path / "raw")["producer"].collect()
    assert len(stored) == 3
    assert all(r["state"].startswith("dx1:zlib+aesgcm:") for r in stored)
    assert '"amount"' not in json.dumps([r.asDict() for r in stored], default=str)
    decoded_args = [*common, "--decode", "tests.spark.test_stored:CURRENT"]
    assert main([*decoded_args, "--out", str(tmp_path / "plain")]) == 0
    plain = read_snapshot(spark, tmp_path / "plain")["producer"]
    states = sorted(json.loads(r["state"])["cents"] for r in plain.collect())
    assert states == [100, 200, 300]
    entries = conform(plain).entries.collect()
    assert sorted(json.loads(r.payload)["cents"] for r in entries) == [100, 200, 300]
    manifest = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert manifest["source"]["decoded"] is True


def test_export_refuses_a_decode_target_that_is_not_stored_values(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    args = ["export", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    args += ["--reader", "datasource", "--out", str(tmp_path / "x")]
    assert main([*args, "--decode", "tests.spark.test_stored:credit"]) == 2
    assert "not a StoredValues" in capsys.readouterr().err
    assert main([*args, "--decode", "no_such_module_here:x"]) == 2
    assert main([*args, "--decode", "json"]) == 2


def test_raw_rows_carry_the_state_version() -> None:
    row = raw_row({"_id": "a", "state_version": 3}, RAW_DOCUMENT_SCHEMA)
    assert row[RAW_DOCUMENT_SCHEMA.fieldNames().index("state_version")] == "3"
