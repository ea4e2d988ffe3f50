"""The example runs with ``docoutbox run``, on MongoDB and on Cosmos DB: both endpoints in
one process, JSON logs, a health endpoint, and a SIGTERM that stops them cleanly (exit 0)
with nothing left behind: every order settled, every outbox empty, every queue drained."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.examples.order_inventory.conftest import Shop

pytestmark = pytest.mark.rabbitmq

ROOT = Path(__file__).resolve().parents[3]
ORDERS = 6


def _lines(process: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert process.stderr is not None
    for line in process.stderr:
        yield json.loads(line)


def test_docoutbox_run_serves_both_endpoints_and_stops_on_sigterm(shop: Shop) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "docoutbox_app",
            "run",
            f"examples.order_inventory.{shop.store}:orders",
            f"examples.order_inventory.{shop.store}:inventory",
            "--health-port",
            "0",
            "--log-format",
            "json",
        ],
        cwd=ROOT,
        env={**os.environ},  # SHOP, MONGODB_URI, RABBITMQ_URL from the fixture
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[dict[str, Any]] = []
    try:
        lines = _lines(process)
        started: set[str] = set()
        port = None
        for line in lines:
            seen.append(line)
            if line["event"] == "endpoint_serving":
                port = int(line["port"])
            if line["event"] == "endpoint_started":
                started.add(line["endpoint"])
            if started == {"orders", "inventory"}:
                break
        assert port is not None, seen
        restock = {"id": "r-1", "type": "Restock", "payload": {"sku": "apple", "qty": 100}}
        shop.command(restock)
        for n in range(ORDERS):
            payload = {"order_id": f"o-{n}", "sku": "apple", "qty": 1}
            shop.command({"id": f"c-{n}", "type": "PlaceOrder", "payload": payload}, 2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = shop.orders(ORDERS)
            if sum(s.status == "reserved" for k, s in found.items() if k != "pending") == ORDERS:
                break
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz") as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        seen.extend(lines)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    events = [line["event"] for line in seen]
    assert events.count("endpoint_stopped") == 2, events
    assert events.count("dispatcher_stopped") == 2, events
    stock = shop.stock()
    assert shop.orders(ORDERS)["pending"] == stock["pending"] == []
    assert stock["apple"].available == 100 - ORDERS
    assert shop.box.depth(f"{shop.name}.orders") == shop.box.depth(f"{shop.name}.inventory") == 0
    assert all("guest:guest" not in json.dumps(line) for line in seen)


@pytest.mark.parametrize("shop", ["mongo"], indirect=True)
def test_a_sigterm_while_starting_is_a_clean_stop(shop: Shop, tmp_path: Path) -> None:
    marker = tmp_path / "importing"
    (tmp_path / "slow_shop.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(2)\n"
        "from examples.order_inventory.mongo import orders\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "docoutbox_app", "run", "slow_shop:orders", "--log-format", "json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    events = [json.loads(line)["event"] for line in err.splitlines()]
    assert "signal_received" in events and events[-1] == "endpoint_stopped", events
