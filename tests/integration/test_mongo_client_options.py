"""The MongoDB URI's own options are kept: pymongo lets keyword options override the URI's,
so the wiring passes only what the caller asked for or the URI leaves unset. Before, a
URI's ``serverSelectionTimeoutMS``, ``connectTimeoutMS`` and ``appName`` were silently
replaced by 5 s and "docoutbox".

Here: a client and the CLI against an unreachable server (sockets, a child process); the
pure option mapping is in ``tests/unit/test_mongo_client_options.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from pymongo import MongoClient

from docoutbox.errors import StoreError
from docoutbox_mongo.kit import client_options, connect_database
from tests.support.servers import REPO_ROOT
from tests.unit.test_mongo_client_options import UNREACHABLE


def test_the_client_gets_the_uri_options() -> None:
    uri = UNREACHABLE + "?serverSelectionTimeoutMS=200&appName=orders-audit"
    client = MongoClient(uri, connect=False, **client_options(uri, None, "app"))
    try:
        assert client.options.server_selection_timeout == 0.2
        assert client.options.pool_options.metadata["application"] == {"name": "orders-audit"}
    finally:
        client.close()
    with pytest.raises(StoreError, match=r"Timeout: 0\.2s"):
        connect_database(uri, "db")


@pytest.mark.parametrize(
    ("extra", "seen"),
    [([], "Timeout: 0.3s"), (["--server-timeout", "0.2"], "Timeout: 0.2s")],
)
def test_the_cli_waits_as_long_as_the_uri_says_unless_told(extra: list[str], seen: str) -> None:
    uri = UNREACHABLE + "?serverSelectionTimeoutMS=300"
    command = ["outbox", "stats", "--mongo-uri", uri, "--db", "x", "--collection", "y"]
    done = subprocess.run(
        [sys.executable, "-m", "docoutbox_app", *command, *extra],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert done.returncode == 1 and seen in done.stderr, done.stderr
