"""The ``docoutbox dispatch`` command as a subprocess: SIGTERM, bad URIs, masked secrets."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import IO, Any

import pytest
from pymongo import MongoClient

from docoutbox import AggregateStore
from docoutbox.cli import main
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_mongo import MongoBackend
from tests.support.servers import REPO_ROOT

SECRET = "s3cr%40t-pw"  # percent-encoded "s3cr@t-pw"


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "docoutbox", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )


def lines_of(stream: IO[str]) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            out.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return out


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        pytest.param(f"mongodb://alice:{SECRET}@127.0.0.1:1/", "unavailable", id="unreachable"),
        pytest.param(f"mongodb://alice:{SECRET}@host:port/", "invalid", id="bad-port"),
        pytest.param(f"http://alice:{SECRET}@host/", "InvalidURI", id="bad-scheme"),
        pytest.param(f"mongodb://alice:{SECRET}@/", "Empty host", id="no-host"),
    ],
)
def test_an_unusable_server_is_one_clear_line_and_a_failing_exit(uri: str, expected: str) -> None:
    proc = cli(
        "dispatch", "--mongo-uri", uri, "--db", "d", "--collection", "c", "--server-timeout", "0.5"
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith("docoutbox: error: "), err
    assert expected in err
    assert "alice:***@" in err
    assert "s3cr" not in err and "t-pw" not in err
    assert out == ""


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dispatch", "--mongo-uri", "", "--db", "d", "--collection", "c"]) == 2
    assert "--mongo-uri" in capsys.readouterr().err
    uri = f"mongodb://alice:{SECRET}@127.0.0.1:1/"
    args = ["dispatch", "--mongo-uri", uri, "--db", "d", "--collection", "c"]
    assert main([*args, "--publisher", "rabbitmq", "--rabbitmq-url", ""]) == 2
    assert main([*args, "--lease-ttl", "0"]) == 2
    assert main([*args, "--concurrency", "0"]) == 2
    assert "s3cr" not in capsys.readouterr().err


@pytest.fixture
def database(mongo_uri: str) -> Iterator[Any]:
    client: MongoClient[Any] = MongoClient(mongo_uri, uuidRepresentation="standard")
    db = client[f"cli_{uuid.uuid4().hex[:10]}"]
    yield db
    client.drop_database(db.name)
    client.close()


@pytest.mark.wire
@pytest.mark.parametrize("flags", [(), ("--async",)], ids=["threaded", "async"])
def test_sigterm_finishes_checkpoints_releases_and_exits_0(
    mongo_uri: str, database: Any, flags: tuple[str, ...]
) -> None:
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)
    for i in range(10):
        store.handle(f"early{i % 3}", add_msg(f"e{i}", emits=2), counter_handlers, create=True)
    proc = cli(
        "dispatch",
        *("--mongo-uri", mongo_uri, "--db", database.name, "--collection", "aggs"),
        *("--publisher", "stdout", "--lease-ttl", "2", "--name", "cli-test"),
        *("--checkpoint-interval", "3600"),  # saved once early, then only on shutdown
        *flags,
    )
    assert proc.stdout is not None
    lines = lines_of(proc.stdout)
    checkpoints = database["docoutbox_checkpoints"]
    try:
        published = [json.loads(lines.get(timeout=30)) for _ in range(20)]
        deadline = time.monotonic() + 20
        while (before := checkpoints.find_one({"_id": "cli-test"})) is None:
            assert time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.05)
        for i in range(10):
            store.handle(f"late{i % 4}", add_msg(f"l{i}", emits=1), counter_handlers, create=True)
        published += [json.loads(lines.get(timeout=20)) for _ in range(10)]
        while database["aggs"].count_documents({"outbox.0": {"$exists": True}}):
            assert time.monotonic() < deadline, "entries still pending"
            time.sleep(0.05)
        time.sleep(0.3)  # let the trims' own events pass, so the checkpoint can move
        assert checkpoints.find_one({"_id": "cli-test"}) == before
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    seqs: dict[str, list[int]] = defaultdict(list)
    for entry in published:
        seqs[entry["aggregate_id"]].append(entry["seq"])
    assert seqs == {
        doc["_id"]: list(range(1, doc["outbox_seq"] + 1)) for doc in database["aggs"].find()
    }
    checkpoint = checkpoints.find_one({"_id": "cli-test"})
    assert checkpoint is not None and set(checkpoint["token"]) == {"resume_after"}
    assert before is not None and checkpoint["token"] != before["token"]  # written on stop
    assert database["docoutbox_leases"].count_documents({}) == 0  # released, left the group
    assert "signal_received signal=SIGTERM" in err
    assert "dispatcher_stopped name=cli-test" in err
    assert "published=30" in err


def test_sigterm_while_connecting_is_an_orderly_stop() -> None:
    """A stop requested before the server answers must not kill the process by signal."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts connections, never answers
    port = silent.getsockname()[1]
    try:
        proc = cli(
            "dispatch",
            "--mongo-uri",
            f"mongodb://127.0.0.1:{port}/",
            "--db",
            "d",
            "--collection",
            "c",
            "--server-timeout",
            "4",
            "--log-level",
            "DEBUG",
        )
        assert proc.stderr is not None
        lines = lines_of(proc.stderr)
        seen: list[str] = []
        while not any("connecting mongo=" in line for line in seen):
            seen.append(lines.get(timeout=30))  # inside the connection attempt now
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.2)  # let the reader thread drain the rest
        while not lines.empty():
            seen.append(lines.get())
        err = "".join(seen)
    finally:
        silent.close()
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {err}"
    assert "signal_received signal=SIGTERM" in err


def test_a_leased_dispatcher_partitioned_unlike_the_stores_refuses_to_start(
    mongo_uri: str, database: Any
) -> None:
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)  # 16 partitions
    for i in range(20):
        store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
    proc = cli(
        "dispatch",
        *("--mongo-uri", mongo_uri, "--db", database.name, "--collection", "aggs"),
        *("--publisher", "memory", "--partitions", "4"),
    )
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert "refusing to dispatch" in err and "--partitions" in err
    assert database["aggs"].count_documents({"outbox.0": {"$exists": True}}) == 20
