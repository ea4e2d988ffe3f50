"""``docoutbox dispatch --metrics-port``: Prometheus figures and health, scraped while
entries are pending, compared with the database.

The dispatcher polls once an hour (``--poll-interval 3600``): after its first sweep, the
entries committed stay pending while the endpoint is scraped.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import IO, Any

import pytest

from docoutbox import AggregateStore, Message, StoreConfig
from docoutbox_app.cli import main
from docoutbox_mongo import MongoBackend
from tests.integration.test_admin import Order, order_handlers
from tests.support.servers import REPO_ROOT

pytestmark = pytest.mark.wire


def _lines(stream: IO[str]) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            out.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return out


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_scraped_backlog_matches_the_database(mongo: Any, mongo_uri: str) -> None:
    orders = AggregateStore(MongoBackend(mongo["orders"]), Order, StoreConfig(partitions=4))
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "docoutbox_app", "dispatch",
            "--mongo-uri", mongo_uri, "--db", mongo.name, "--collection", "orders",
            "--partitions", "4", "--lease-ttl", "3", "--poll-interval", "3600",
            "--publisher", "stdout",
            "--metrics-port", "0", "--backlog-interval", "0.2", "--log-format", "json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = _lines(proc.stderr)
    seen: list[dict[str, Any]] = []

    def until(event: str) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, seen
            record: dict[str, Any] = json.loads(lines.get(timeout=30))  # one JSON object a line
            seen.append(record)
            if record["event"] == event:
                return record

    try:
        port = int(until("endpoint_serving")["port"])
        until("sweep_done")  # the start-up sweep; the next one is an hour away
        for n in range(3):
            kinds = ["A"] * (n + 1) + ["B"]
            message = Message(id=f"m{n}", type="Place", payload={"emit": kinds})
            orders.handle(f"o{n}", message, order_handlers, create=True)
            time.sleep(0.05)
        docs = list(mongo["orders"].find({"outbox.0": {"$exists": True}}))
        entries = sum(len(d["outbox"]) for d in docs)
        oldest = min(e["created_at"] for d in docs for e in d["outbox"]).replace(tzinfo=UTC)
        assert entries == 9
        deadline = time.monotonic() + 30
        while True:  # the next measurement sees them
            status, text = _get(port, "/metrics")
            asked_at = datetime.now(UTC)
            values = _samples(text)
            work = {k: v for k, v in values.items() if k.startswith("docoutbox_pending_work_ent")}
            if values.get("docoutbox_outbox_pending_entries") == sum(work.values()) == entries:
                break
            assert time.monotonic() < deadline, values
            time.sleep(0.1)

        # The figures are the database's, not the work queue's.
        assert status == 200 and values["docoutbox_dispatcher_queued"] == 0
        assert values["docoutbox_outbox_pending_aggregates"] == len(docs) == 3
        expected_age = (asked_at - oldest).total_seconds()
        assert expected_age - 2 <= values["docoutbox_outbox_oldest_age_seconds"] <= expected_age
        by_partition = {
            str(p): sum(len(d["outbox"]) for d in docs if d["partition"] == p) for p in range(4)
        }
        for partition, count in by_partition.items():
            key = f'docoutbox_outbox_partition_pending_entries{{partition="{partition}"}}'
            assert values.get(key, 0.0) == count
            # Pending work per partition: every partition a series, idle ones 0.
            key = f'docoutbox_pending_work_entries{{partition="{partition}",unit="partition"}}'
            assert values[key] == count
        assert values['docoutbox_pending_work_partitions{unit="partition"}'] == 4

        assert _get(port, "/healthz")[0] == 200
        status, body = _get(port, "/readyz")
        report = json.loads(body)
        assert status == 200 and report["ready"] and report["stream_open"] is None
        assert report["leases"] == [0, 1, 2, 3]
        status, body = _get(port, "/health")
        assert status == 200 and json.loads(body)["backlog"]["entries"] == entries
        assert _get(port, "/nothing")[0] == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    while not lines.empty():
        seen.append(json.loads(lines.get()))
    assert code == 0, seen
    events = [r["event"] for r in seen]
    assert "lease_acquired" not in events  # lease chatter is DEBUG
    # One start-up sweep: the first share's acquisition is not swept a second time (that
    # one, left for after the writes above, published some of the entries scraped here).
    assert events.count("sweep_done") == 1, events
    progress = [r for r in seen if r["event"] == "progress"][-1]  # the last line at stop
    assert progress["backlog_entries"] == str(entries) and progress["eta_s"] == "unknown"


@pytest.mark.parametrize(
    ("option", "value"), [("--metrics-port", "70000"), ("--backlog-interval", "0")]
)
def test_bad_observability_settings_are_refused(
    mongo: Any, mongo_uri: str, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["dispatch", "--mongo-uri", mongo_uri, "--db", mongo.name, "--collection", "c"]
    args += ["--publisher", "stdout"]
    try:
        code = main([*args, "--no-leases", option, value])
    except SystemExit as exited:  # refused by argparse
        code = exited.code
    assert code == 2
    assert option in capsys.readouterr().err
