"""The bank example, in memory, on the MongoDB wire server and on Cosmos DB."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pymongo import MongoClient

from benchmarks.servers import CosmosAccount
from examples.bank import app
from tests.support.cosmos import unique


def check(capsys: pytest.CaptureFixture[str]) -> None:
    out = capsys.readouterr().out
    assert "cmd-2 Withdraw: applied" in out
    assert "cmd-2 Withdraw: duplicate" in out
    assert "relayed 3 messages; again: 0" in out
    assert "alice: owner='Alice' balance=70" in out
    assert "ledger: deposited=100 withdrawn=30 rejected=500" in out


def test_in_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main([]) == 0
    check(capsys)


@pytest.mark.wire
def test_on_mongodb(mongo_uri: str, capsys: pytest.CaptureFixture[str]) -> None:

    scratch = f"bank_{uuid.uuid4().hex[:12]}"  # never a database the test did not create
    client: MongoClient[Any] = MongoClient(mongo_uri)
    try:
        assert scratch not in client.list_database_names()
        assert app.main([mongo_uri, scratch]) == 0
        check(capsys)
    finally:
        client.drop_database(scratch)
        client.close()


@pytest.mark.cosmos
def test_on_cosmos(
    cosmos_server: CosmosAccount,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    monkeypatch.setenv("COSMOS_ENDPOINT", cosmos_server.endpoint)
    monkeypatch.setenv("COSMOS_KEY", cosmos_server.key)
    database = unique("bank")
    try:
        assert app.main(["cosmos", database]) == 0
    finally:
        with cosmos_server.client() as client:
            client.delete_database(database)
    check(capsys)
