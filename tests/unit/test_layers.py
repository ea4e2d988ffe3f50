"""The core's import graph: no cycles, and no module reaching up a layer.

Layers, bottom up: the base modules (model, errors, handlers, retry, codec), then
``store``, then ``dispatch``, then ``receive`` and ``testing``, then ``cli``. A module may
import its own layer and those below it, never those above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import docoutbox

ROOT = Path(docoutbox.__file__).parent
LAYERS = {
    "store": 1,
    "ports": 1,
    "dispatch": 2,
    "receive": 3,
    "testing": 3,
    "observability": 3,
    "cli": 4,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 5


def _is_core(module: str) -> bool:
    return module == "docoutbox" or module.startswith("docoutbox.")


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if _is_core(d) and d != name}
    return graph


def test_no_module_reaches_up_a_layer() -> None:
    graph = _graph()
    wrong = [
        f"{name} -> {dep}"
        for name, deps in graph.items()
        if name != "docoutbox" and not name.endswith("__main__")
        for dep in deps
        if dep != "docoutbox" and _layer(dep) > _layer(name)
    ]
    assert wrong == []


def test_import_graph_has_no_cycles() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError(" -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def test_layers_are_checked() -> None:
    """The checks above see the real tree (guards against an empty walk)."""
    graph = _graph()
    assert "docoutbox.store.core" in graph
    assert "docoutbox.store.document" in graph["docoutbox.store.core"]
    assert _layer("docoutbox.dispatch.engine.flow") > _layer("docoutbox.store.core")
