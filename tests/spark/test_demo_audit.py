"""The demo's own collections pass the audit: every credit a wallet emitted was applied by
exactly one statement, nothing is pending, nothing is malformed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from docoutbox_app.cli import main
from tests.spark.conftest import JARS


def test_demo_collections_pass_the_audit(spark: Any, wire_server: Any, tmp_path: Path) -> None:
    db = f"demo_{uuid.uuid4().hex[:8]}"
    common = ["--mongo-uri", wire_server.uri]
    try:
        assert (
            main(["demo", *common, "--wallets", "4", "--credits", "5", "--db", db, "--keep"]) == 0
        )
        summary = tmp_path / "audit.json"
        code = main(
            [
                "audit",
                *common,
                "--db",
                db,
                "--collection",
                "wallets",
                "--consumer-collection",
                "statements",
                "--reader",
                "datasource",
                "--spark-jars",
                str(JARS),
                "--json",
                str(summary),
                "--progress-interval",
                "0",
            ]
        )
        result = json.loads(summary.read_text())
        assert code == 0, result["failed"]
        assert result["totals"]["documents"] == 4
        assert result["totals"]["pending_entries"] == 0
        assert result["consumer_totals"]["documents"] == 4
        assert {k for k, v in result["findings"].items() if v["count"]} == set()
    finally:
        with MongoClient(wire_server.uri) as client:
            client.drop_database(db)
