"""``docoutbox dispatch --async --metrics-port``: health reports the asyncio dispatcher.

/healthz and /readyz answer 200 once the asyncio dispatcher runs and follows its change
stream (MongoDB) or change feed (Cosmos DB), /health shows it, and after SIGTERM the
process drains and exits 0. (They used to answer 503 "down" for as long as it ran.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from docoutbox import AggregateStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import CosmosBackend
from docoutbox_mongo import MongoBackend
from tests.integration.test_metrics_endpoint import _get, _lines
from tests.support.cosmos import create_container, scratch_database
from tests.support.servers import REPO_ROOT

KEY_ENV = "COSMOS_KEY"


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "docoutbox_app", "dispatch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, **env},
    )


@pytest.fixture(params=["mongo", "cosmos"])
def target(request: pytest.FixtureRequest) -> Iterator[tuple[list[str], dict[str, str], Any]]:
    """(command-line arguments, environment, a store on the dispatched collection)."""
    if request.param == "mongo":
        request.applymarker(pytest.mark.wire)
        mongo = request.getfixturevalue("mongo")

        args = ["--mongo-uri", request.getfixturevalue("mongo_uri"), "--db", mongo.name]
        yield [*args, "--collection", "aggs"], {}, MongoBackend(mongo["aggs"])
        return
    request.applymarker(pytest.mark.cosmos)

    account = request.getfixturevalue("cosmos_server")
    with scratch_database(account) as database:
        container = create_container(database, "aggs")
        args = ["--cosmos-endpoint", account.endpoint, "--database", database.id]
        yield [*args, "--container", "aggs"], {KEY_ENV: account.key}, CosmosBackend(container)


def test_health_reports_the_asyncio_dispatcher(
    target: tuple[list[str], dict[str, str], Any],
) -> None:
    args, env, backend = target
    store = AggregateStore(backend, Counter)
    proc = _start(
        [
            *args, "--async", "--publisher", "stdout", "--lease-ttl", "5",
            "--metrics-port", "0", "--log-format", "json",
        ],
        env,
    )  # fmt: skip
    assert proc.stderr is not None and proc.stdout is not None
    lines, published = _lines(proc.stderr), _lines(proc.stdout)
    seen: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None:
            assert time.monotonic() < deadline, seen
            record = json.loads(lines.get(timeout=60))
            seen.append(record)
            if record["event"] == "endpoint_serving":
                port = int(record["port"])
        while True:  # live and ready once the loop runs and the stream is open
            live, _ = _get(port, "/healthz")
            ready, body = _get(port, "/readyz")
            if live == 200 and ready == 200:
                break
            assert time.monotonic() < deadline, (live, ready, body)
            time.sleep(0.1)
        report = json.loads(body)
        assert report["status"] == "ready" and report["stream_open"] is True
        assert report["leases"] != []
        store.handle("a1", add_msg("m1", emits=2), counter_handlers, create=True)
        assert [json.loads(published.get(timeout=30))["seq"] for _ in range(2)] == [1, 2]
        status, body = _get(port, "/health")
        assert status == 200 and json.loads(body)["live"] is True
        # The pending work is measured per stored partition (MongoDB, --partitions 16 by
        # default) or per feed range (Cosmos DB: the local server's four).
        status, text = _get(port, "/metrics")
        unit, count = ("feed_range", 4) if KEY_ENV in env else ("partition", 16)
        assert f'docoutbox_pending_work_partitions{{unit="{unit}"}} {count}.0' in text, text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    while not lines.empty():
        seen.append(json.loads(lines.get()))
    assert code == 0, seen
    assert any(r["event"] == "dispatcher_stopped" for r in seen), seen
