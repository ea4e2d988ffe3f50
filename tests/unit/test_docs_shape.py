"""The documents keep the shape users and CI rely on.

Rule: README.md stays short (at most 200 lines) and keeps the two commands CI and users
run as written; the benchmarks page for users stays under 25 KB; tests/README.md keeps a
"Fidelity gaps" section; and every Python block is fenced as ``python``, so that the
snippet test (``tests/integration/test_readme.py``) runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\S*)", flags=re.MULTILINE)


def test_readme_is_short_and_keeps_its_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "```sh\nscripts/demo\n```" in text
    assert "```sh\nscripts/test\n```" in text


def test_benchmarks_page_is_under_25_kb() -> None:
    assert (ROOT / "docs" / "benchmarks.md").stat().st_size < 25_000


def test_tests_readme_keeps_a_fidelity_gaps_section() -> None:
    assert "\n## Fidelity gaps\n" in (ROOT / "tests" / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_python_blocks_are_fenced_as_python(page: Path) -> None:
    """``py``, ``python3`` or ``pycon`` blocks would escape the snippet test."""
    languages = set(FENCE.findall(page.read_text()))
    assert not languages & {"py", "python3", "pycon", "Python"}


def test_every_page_is_in_the_site() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        assert str(page.relative_to(ROOT / "docs")) in config, page
