"""The README's Python snippets run as written, against the MongoDB wire server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pymongo import MongoClient

README = Path(__file__).resolve().parents[2] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_snippets() -> None:
    assert snippets()


@pytest.mark.wire
@pytest.mark.parametrize("index", range(len(snippets())))
def test_snippet_runs(
    index: int, mongo_uri: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    MongoClient(mongo_uri).drop_database("bank")
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    code = compile(snippets()[index], f"README.md[{index}]", "exec", dont_inherit=True)
    exec(code, {"__name__": "readme"})
    if index == 0:
        assert capsys.readouterr().out.strip() == "1 5 ['Deposited']"
