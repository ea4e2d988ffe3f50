"""Each package's docstring lists every module it holds (one line each), so that a
reader knows from the package what lives where."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = [ROOT / "docoutbox", *sorted((ROOT / "adapters").glob("docoutbox_*"))]
PACKAGE_ROOTS += sorted((ROOT / "app").glob("docoutbox_*"))
PACKAGES = sorted(init.parent for root in PACKAGE_ROOTS for init in root.rglob("__init__.py"))


def _unlisted(package: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    held = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    held += [p.parent.name for p in package.glob("*/__init__.py")]
    return sorted(name for name in held if f".{name}`" not in doc and f".{name}:" not in doc)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_docstring_lists_every_module(package: Path) -> None:
    assert _unlisted(package) == []


def test_every_package_is_checked() -> None:
    names = {str(p.relative_to(ROOT)) for p in PACKAGES}
    assert {"docoutbox", "docoutbox/dispatch/engine", "adapters/docoutbox_mongo"} <= names
    assert "app/docoutbox_app/cli" in names
