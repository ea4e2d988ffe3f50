"""The demonstration (the README's main job) checks itself: it exits 0 only if exactly once held."""

from __future__ import annotations

import pytest

from docoutbox.cli import main

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
