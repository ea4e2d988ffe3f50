"""The demonstration (the README's main job) checks itself: it exits 0 only if exactly once held."""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox_app.cli import main
from tests.support.processes import CliProcess

SMALL = ["--wallets", "5", "--credits", "8", "--timeout", "60"]


def test_demo_in_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "commands:    40 applied" in out
    assert "exactly once: yes" in out


@pytest.mark.wire
def test_demo_on_mongodb(mongo_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--mongo-uri", mongo_uri, *SMALL]) == 0
    out = capsys.readouterr().out
    assert "store:       mongodb" in out
    assert "exactly once: yes" in out


def _exit_code(argv: list[str]) -> Any:
    try:
        return main(argv)
    except SystemExit as exited:  # argparse
        return exited.code


@pytest.mark.parametrize(
    "bad",
    [
        ["--wallets", "0"],  # ran, checked nothing and said "exactly once: yes"
        ["--credits", "0"],  # NotFound traceback from the report
        ["--wallets", "99999999999"],  # built commands until the memory ran out
        ["--wallets", "100000", "--credits", "100"],
        ["--redeliver", "2"],  # ValueError traceback from random.sample
        ["--redeliver", "nan"],
        ["--duplicate", "-0.5"],
        ["--timeout", "nan"],
        ["--timeout", "0"],
        ["--db", "a.b"],
    ],
)
def test_demo_refuses_bad_arguments_with_exit_2(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(["demo", *bad]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert bad[0] in err


def test_a_demo_that_times_out_reports_instead_of_crashing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Statements not written yet when the time is up are problems in the report (they
    were a NotFound traceback)."""
    code = main(["demo", "--wallets", "20", "--credits", "25", "--timeout", "0.001"])
    out = capsys.readouterr().out
    assert "exactly once: " in out
    assert code == (0 if "exactly once: yes" in out else 1)


def test_an_unreachable_server_is_one_error_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--mongo-uri", "mongodb://alice:pw-s3cret@127.0.0.1:1/"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("docoutbox: error: cannot use MongoDB") and err.count("\n") == 1
    assert "pw-s3cret" not in err


@pytest.mark.wire
def test_demo_never_runs_in_nor_drops_a_database_holding_data(
    mongo_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo drops its database at the end: given --db of someone's data, it dropped
    that data."""
    client: Any = MongoClient(mongo_uri)
    name = f"demo_keep_{uuid.uuid4().hex[:8]}"
    try:
        client[name]["accounts"].insert_one({"_id": "a", "balance": 5})
        assert main(["demo", "--mongo-uri", mongo_uri, "--db", name, *SMALL]) == 2
        assert "already holds collections" in capsys.readouterr().err
        assert client[name]["accounts"].find_one() == {"_id": "a", "balance": 5}
        assert client[name].list_collection_names() == ["accounts"]
    finally:
        client.drop_database(name)
        client.close()


def test_demo_stops_on_sigterm_as_on_ctrl_c_without_a_traceback() -> None:
    proc = CliProcess(["demo", "--wallets", "300", "--credits", "300"], pipes=True)
    time.sleep(3)
    _out, err = proc.communicate(signal=signal.SIGTERM)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
