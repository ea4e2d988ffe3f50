"""The CLI names the store in use, and the extra to install when its adapter is missing."""

from __future__ import annotations

import sys

import pytest

from docoutbox_app.cli import main

COSMOS = ["--cosmos-endpoint", "https://localhost:1", "--cosmos-key", "a2V5"]


@pytest.mark.parametrize(
    "argv",
    [
        [
            "dispatch",
            *COSMOS,
            "--db",
            "shop",
            "--collection",
            "orders",
            "--publisher",
            "memory",
            "--discard-entries",
        ],
        ["outbox", "stats", *COSMOS, "--db", "shop", "--collection", "orders"],
        ["leases", *COSMOS, "--db", "shop"],
    ],
    ids=["dispatch", "outbox-stats", "leases"],
)
def test_a_missing_adapter_is_named_with_its_extra(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("docoutbox_cosmos", "docoutbox_cosmos.admin", "docoutbox_cosmos.kit"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "the Cosmos DB adapter is not installed" in err
    assert "pip install 'docoutbox[cosmos]'" in err
