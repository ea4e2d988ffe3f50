"""The README's Python snippets run as written, against the MongoDB wire server."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox import Outcome

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
    # The snippets name the database "bank"; the test runs them on a scratch database of
    # its own, so that it never drops (or writes to) a database it did not create.
    scratch = f"readme_{uuid.uuid4().hex[:12]}"
    source = snippets()[index].replace('client["bank"]', f'client["{scratch}"]')
    assert '"bank"' not in source
    client: MongoClient[Any] = MongoClient(mongo_uri)
    assert scratch not in client.list_database_names()
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    code = compile(source, f"README.md[{index}]", "exec", dont_inherit=True)
    try:
        exec(code, {"__name__": "readme"})
    finally:
        client.drop_database(scratch)
        client.close()
    if index == 0:
        assert capsys.readouterr().out.strip() == "1 5 ['Deposited']"


def test_outcome_attributes_named_in_readme_exist() -> None:
    """The README's description of ``Outcome`` matches the class."""
    sentence = re.search(r"`Outcome` says ([^;]*);", README.read_text().replace("\n", " "))
    assert sentence is not None
    names = re.findall(r"`(\w+)`", sentence.group(1))
    assert names == ["applied", "duplicate", "gave_up"]
    for name in names:
        assert isinstance(getattr(Outcome, name), property), name
