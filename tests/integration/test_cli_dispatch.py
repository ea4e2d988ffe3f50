"""The ``docoutbox dispatch`` command as a subprocess: SIGTERM, bad URIs, masked secrets."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

import docoutbox_mongo.kit
from benchmarks.rabbit import sandbox
from docoutbox import AggregateStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_app.cli import main
from docoutbox_mongo import MongoBackend
from tests.support.e2e import require_rabbitmq
from tests.support.processes import CliProcess

SECRET = "s3cr%40t-pw"  # percent-encoded "s3cr@t-pw"


def cli(*args: str) -> CliProcess:
    return CliProcess(list(args), pipes=True)


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
        *("dispatch", "--mongo-uri", uri, "--db", "d", "--collection", "c"),
        *("--server-timeout", "0.5", "--publisher", "stdout"),
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith("docoutbox: error: "), err
    assert expected in err
    assert "alice:***@" in err
    assert "s3cr" not in err and "t-pw" not in err
    assert out == ""


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    empty = ["dispatch", "--mongo-uri", "", "--db", "d", "--collection", "c"]
    assert main([*empty, "--publisher", "stdout"]) == 2
    assert "--mongo-uri" in capsys.readouterr().err
    uri = f"mongodb://alice:{SECRET}@127.0.0.1:1/"
    args = ["dispatch", "--mongo-uri", uri, "--db", "d", "--collection", "c"]
    assert main([*args, "--publisher", "rabbitmq", "--rabbitmq-url", ""]) == 2
    assert main([*args, "--publisher", "kafka", "--kafka-bootstrap", ""]) == 2
    assert main([*args, "--publisher", "stdout", "--topic", "orders"]) == 2
    assert _exit_code([*args, "--publisher", "stdout", "--lease-ttl", "0"]) == 2
    assert _exit_code([*args, "--publisher", "stdout", "--concurrency", "0"]) == 2
    assert _exit_code([*args, "--publisher", "stdout", "--run-batch", "0"]) == 2
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
    lines = proc.lines()
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
        _, err = proc.terminate(timeout=30)
    finally:
        proc.close()
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
            "--publisher",
            "stdout",
        )
        lines = proc.lines("stderr")
        seen: list[str] = []
        try:
            while not any("connecting mongo=" in line for line in seen):
                seen.append(lines.get(timeout=30))  # inside the connection attempt now
            proc.stop()
        finally:
            proc.close()
        time.sleep(0.2)  # let the reader thread drain the rest
        while not lines.empty():
            seen.append(lines.get())
        err = "".join(seen)
    finally:
        silent.close()
    code = proc.returncode
    assert code is not None and code >= 0, f"killed by signal {-(code or 0)}: {err}"
    assert "signal_received signal=SIGTERM" in err


def _exit_code(argv: list[str]) -> Any:
    """What ``docoutbox`` exits with (argparse exits by raising SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exited:
        return exited.code


def _dispatch_args(mongo_uri: str, db: str, *extra: str) -> list[str]:
    return ["dispatch", "--mongo-uri", mongo_uri, "--db", db, "--collection", "aggs", *extra]


def _one_error_line(proc: CliProcess, seconds: float) -> str:
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < seconds, err
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith("docoutbox: error: "), err
    assert out == ""
    return err


def _untouched(database: Any) -> None:
    """Nothing written: no checkpoint, no lease, no dead letter, the entries still pending."""
    assert database["docoutbox_checkpoints"].count_documents({}) == 0
    assert database["docoutbox_leases"].count_documents({}) == 0
    assert database["docoutbox_dead_letters"].count_documents({}) == 0
    assert database["aggs"].count_documents({"outbox.0": {"$exists": True}}) == 1


@pytest.mark.wire
def test_a_wrong_broker_password_is_one_line_within_seconds(mongo_uri: str, database: Any) -> None:
    url = require_rabbitmq()
    parts = url.split("@", 1)
    assert len(parts) == 2, url
    wrong = parts[0].rsplit(":", 1)[0] + ":not-the-password@" + parts[1]
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)
    store.handle("a", add_msg("m1"), counter_handlers, create=True)
    proc = cli(
        *_dispatch_args(mongo_uri, database.name, "--log-level", "DEBUG"),
        *("--publisher", "rabbitmq", "--rabbitmq-url", wrong, "--exchange", "x"),
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("docoutbox: error: ") and "refused the credentials" in last, err
    assert "not-the-password" not in err
    _untouched(database)


@pytest.mark.wire
def test_a_wrong_broker_password_logs_one_line_at_info(mongo_uri: str, database: Any) -> None:
    url = require_rabbitmq()
    head, tail = url.split("@", 1)
    wrong = head.rsplit(":", 1)[0] + ":not-the-password@" + tail
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)
    store.handle("a", add_msg("m1"), counter_handlers, create=True)
    proc = cli(
        *_dispatch_args(mongo_uri, database.name, "--log-level", "WARNING"),
        *("--publisher", "rabbitmq", "--rabbitmq-url", wrong),
    )
    err = _one_error_line(proc, seconds=15)
    assert "refused the credentials" in err
    _untouched(database)


@pytest.mark.wire
def test_a_missing_exchange_is_one_line_and_declare_exchange_fixes_it(
    mongo_uri: str, database: Any
) -> None:
    url = require_rabbitmq()
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)
    store.handle("a", add_msg("m1"), counter_handlers, create=True)
    with sandbox(url) as box:
        exchange, _, _ = box.names()
        base = [
            *_dispatch_args(mongo_uri, database.name, "--log-level", "WARNING"),
            *("--publisher", "rabbitmq", "--rabbitmq-url", url, "--exchange", exchange),
        ]
        err = _one_error_line(cli(*base), seconds=15)
        assert f"exchange {exchange!r} does not exist" in err and "--declare-exchange" in err
        _untouched(database)

        proc = cli(*base, "--declare-exchange", "topic", "--no-leases", "--poll-interval", "0.2")
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    box.channel.exchange_declare(exchange, passive=True)
                    break
                except Exception:  # the channel closes on a 404; reopen it
                    box.channel = box.connection.channel()
                    time.sleep(0.1)
            else:
                pytest.fail("the exchange was never declared")
        finally:
            proc.terminate()
        assert proc.returncode == 0


def test_memory_publisher_needs_an_explicit_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["dispatch", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    assert _exit_code(args) == 2  # no --publisher at all
    assert "--publisher" in capsys.readouterr().err
    assert main([*args, "--publisher", "memory"]) == 2
    assert "--discard-entries" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad",
    [
        ["--lease-ttl", "nan"],
        ["--grace", "nan"],
        ["--sweep-interval", "inf"],
        ["--checkpoint-interval", "-1"],
        ["--progress-interval", "-5"],
        ["--server-timeout", "-5"],
        ["--poll-interval", "0"],
        ["--partitions", "0"],
        ["--partitions", "1.5"],
        ["--partitions", "99999999999999"],  # more than StoreConfig allows: hung, deaf to SIGTERM
        ["--lease-ttl", "1e300"],  # overflowed a timedelta in the lease keeper
        ["--concurrency", "99999999999999999999"],  # InvalidConfig traceback after parsing
        ["--run-batch", "2147483648"],
        ["--max-attempts", "2147483648"],
        ["--server-timeout", "1e300"],  # refused by pymongo only after connecting: exit 1
        ["--backlog-interval", "1e300"],  # OverflowError in the backlog thread
        ["--grace", "1e300"],
        ["--sweep-interval", "1e300"],
        ["--poll-interval", "1e300"],
        ["--checkpoint-interval", "1e300"],
        ["--collection", "$cmd"],
        ["--collection", "system.users"],
        ["--db", "a/b"],
        ["--publisher", "rabbitmq", "--rabbitmq-url", "not a url"],
        ["--publisher", "rabbitmq", "--rabbitmq-url", "amqp://u:p@host:port/"],
        ["--publisher", "stdout", "--exchange", "x"],
    ],
)
def test_bad_options_exit_2_before_connecting(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["dispatch", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    if "--publisher" not in bad:
        args += ["--publisher", "stdout"]
    assert _exit_code([*args, *bad]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ":p@" not in err


ADMIN_COMMANDS = [
    ["outbox", "stats", "--collection", "c"],
    ["dead-letters", "list"],
    ["dead-letters", "show", "x"],
    ["dead-letters", "replay", "x"],
    ["dead-letters", "purge", "--yes"],
    ["leases"],
]


@pytest.mark.parametrize("command", ADMIN_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(
    "bad",
    [
        ["--server-timeout", "nan"],  # was a ValueError traceback
        ["--server-timeout", "inf"],  # was an OverflowError traceback
        ["--server-timeout", "-1"],  # was "cannot use MongoDB", exit 1
        ["--server-timeout", "1e300"],
        ["--db", "a.b"],
        ["--db", ""],
        ["--dead-letters", ""],  # was an InvalidName traceback
        ["--leases", "$cmd"],
    ],
)
def test_operating_commands_refuse_bad_options_with_exit_2(
    command: list[str], bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*command, "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d"]
    assert _exit_code([*args, "--server-timeout", "0.2", *bad]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert bad[0] in err


@pytest.mark.parametrize("limit", ["-1", "99999999999999999999", "x"])
def test_dead_letters_list_refuses_a_limit_it_cannot_use(
    limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["dead-letters", "list", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d"]
    assert _exit_code([*args, "--server-timeout", "0.2", "--limit", limit]) == 2
    assert "--limit" in capsys.readouterr().err


def test_a_bound_is_named_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    # It was printed as "at most 2.14748e+09", a value the option accepts.
    args = ["dispatch", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    assert _exit_code([*args, "--publisher", "stdout", "--concurrency", "2147483648"]) == 2
    assert "must be at most 2147483647: 2147483648" in capsys.readouterr().err


@pytest.mark.wire
def test_polling_mode_delivers_within_seconds(mongo_uri: str, database: Any) -> None:
    """Without a change stream (--poll-interval), a new entry is published within about
    one interval, not after the default sweep's 60 s + 30 s grace."""
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)
    proc = cli(
        *_dispatch_args(mongo_uri, database.name),
        *("--publisher", "stdout", "--no-leases", "--poll-interval", "0.5"),
    )
    lines = proc.lines()
    try:
        time.sleep(1.0)
        store.handle("p", add_msg("m1"), counter_handlers, create=True)
        start = time.monotonic()
        published = json.loads(lines.get(timeout=20))
        assert published["aggregate_id"] == "p"
        assert time.monotonic() - start < 5
    finally:
        _, err = proc.terminate()
    assert proc.returncode == 0, err
    assert "mode=polling every 0.5s" in err


@pytest.mark.wire
def test_the_memory_publisher_says_loudly_that_it_discards(mongo_uri: str, database: Any) -> None:
    proc = cli(
        *_dispatch_args(mongo_uri, database.name),
        *("--publisher", "memory", "--discard-entries", "--no-leases", "--poll-interval", "0.2"),
    )
    lines = proc.lines("stderr")
    seen: list[str] = []
    try:
        while not any("dispatcher_started" in line for line in seen):
            seen.append(lines.get(timeout=30))
    finally:
        proc.terminate()
    warning = [line for line in seen if "publisher=memory" in line]
    assert warning and "level=WARNING" in warning[0] and "WITHOUT being delivered" in warning[0]
    assert proc.returncode == 0


def test_a_leased_dispatcher_partitioned_unlike_the_stores_refuses_to_start(
    mongo_uri: str, database: Any
) -> None:
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)  # 16 partitions
    for i in range(20):
        store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
    proc = cli(
        "dispatch",
        *("--mongo-uri", mongo_uri, "--db", database.name, "--collection", "aggs"),
        *("--publisher", "memory", "--discard-entries", "--partitions", "4"),
    )
    _, err = proc.communicate()
    assert proc.returncode == 1, err
    assert "refusing to dispatch" in err and "--partitions" in err
    assert database["aggs"].count_documents({"outbox.0": {"$exists": True}}) == 20


@pytest.mark.wire
def test_a_dead_letter_that_cannot_be_replayed_is_one_error_line(
    mongo_uri: str, database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reason (a pydantic validation report) spanned several lines."""
    database["docoutbox_dead_letters"].insert_one(
        {"_id": "e1", "origin": "dispatch", "aggregate_id": "a1", "entry": {"id": "e1"}}
    )
    args = ["dead-letters", "replay", "--mongo-uri", mongo_uri, "--db", database.name]
    assert main([*args, "--collection", "aggs", "e1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("docoutbox: error: dead letter 'e1' holds a malformed entry")
    assert err.count("\n") == 1
    assert database["docoutbox_dead_letters"].count_documents({}) == 1


@pytest.mark.wire
@pytest.mark.parametrize("driver", [[], ["--async"]], ids=["threads", "asyncio"])
def test_a_closed_stdout_stops_the_stdout_publisher_and_loses_nothing(
    mongo_uri: str, database: Any, driver: list[str]
) -> None:
    """``docoutbox dispatch --publisher stdout | head -1``: once the reader is gone every
    publish raised BrokenPipeError, logged with a traceback, and the command never
    ended. It now stops, exits 1 with one line, and the entries stay pending."""
    store = AggregateStore(MongoBackend(database["aggs"]), Counter)
    for i in range(5):
        store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
    proc = cli(*_dispatch_args(mongo_uri, database.name), "--publisher", "stdout", *driver)
    assert proc.proc.stdout is not None
    proc.proc.stdout.close()  # the reader goes away before the first entry
    try:
        proc.proc.wait(timeout=30)
    finally:
        _, err = proc.communicate(timeout=10) if proc.proc.poll() is not None else proc.terminate()
    assert proc.returncode == 1, err
    assert "docoutbox: error: stdout was closed" in err
    assert "Traceback" not in err
    pending = sum(len(doc.get("outbox", [])) for doc in database["aggs"].find())
    assert pending == 5
    assert database["docoutbox_dead_letters"].count_documents({}) == 0


def test_ctrl_c_in_an_operating_command_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while ``outbox stats`` waits for an unreachable server was a traceback."""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(docoutbox_mongo.kit, "connect_database", interrupted)
    args = ["outbox", "stats", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d"]
    assert main([*args, "--collection", "c"]) == 130
    assert capsys.readouterr().err == "docoutbox: interrupted\n"
