"""The repository's import graph, read from source (AST only, nothing is imported).

Every ``import`` and ``from ... import`` counts, wherever it sits: module level, inside
functions and methods, under ``if TYPE_CHECKING:``, in ``try``/``except ImportError``, and
so does ``importlib.import_module`` of a literal name. Relative imports are resolved. Only
first-party modules are nodes of the graph.

Rings, inside out; a module imports its own ring and those inside it, never outward:

0. the core, ``docoutbox``;
1. the adapters, ``docoutbox_mongo`` ... ``docoutbox_spark``: the core and themselves, never
   another adapter (except :data:`ADAPTER_ALLOWLIST`);
2. the application ring, ``docoutbox_app``;
3. ``benchmarks`` and ``examples``;
4. ``tests`` (the examples' tests included, in ``tests/examples/``): nothing outside it
   imports ``tests``.

Inside the core, layers bottom up: the base modules (model, errors, handlers, retry, codec,
drive), then ``store``, ``stored`` and ``ports``, then ``dispatch`` (its ``engine``, then
``drivers``, then ``extras`` and ``tools``), then ``receive``, ``testing`` and
``observability``, then the package ``docoutbox`` itself. A core module may import its own
layer and those below it; ``from docoutbox import ...`` is left to the cycle check.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Folder (relative to the repository) -> the folder its packages' names start from.
PACKAGE_ROOTS: dict[str, str] = {
    "docoutbox": ".",
    "adapters/docoutbox_mongo": "adapters",
    "adapters/docoutbox_cosmos": "adapters",
    "adapters/docoutbox_rabbitmq": "adapters",
    "adapters/docoutbox_kafka": "adapters",
    "adapters/docoutbox_spark": "adapters",
    "app/docoutbox_app": "app",
    "benchmarks": ".",
    "examples": ".",
    "tests": ".",
}

CORE = 0
ADAPTERS = 1
APPLICATION = 2
OUTER = 3
TESTS = 4

RINGS: dict[str, int] = {
    "docoutbox": CORE,
    "docoutbox_mongo": ADAPTERS,
    "docoutbox_cosmos": ADAPTERS,
    "docoutbox_rabbitmq": ADAPTERS,
    "docoutbox_kafka": ADAPTERS,
    "docoutbox_spark": ADAPTERS,
    "docoutbox_app": APPLICATION,
    "benchmarks": OUTER,
    "examples": OUTER,
    "tests": TESTS,
}
RING_NAMES = {
    CORE: "core",
    ADAPTERS: "adapter",
    APPLICATION: "application",
    OUTER: "benchmarks/examples",
    TESTS: "tests",
}

#: (importing adapter, imported adapter) pairs that are allowed, each for a reason:
#: - the Spark adapter's Cosmos DB data source reads containers with the Cosmos adapter's
#:   client options (TLS, endpoint discovery) and error translation, so that the audit
#:   connects and fails exactly as ``docoutbox dispatch`` does.
ADAPTER_ALLOWLIST: frozenset[tuple[str, str]] = frozenset({("docoutbox_spark", "docoutbox_cosmos")})

#: Layers inside the core, by the module's first names under ``docoutbox``.
CORE_LAYERS: dict[tuple[str, ...], tuple[int, int]] = {
    ("store",): (1, 0),
    ("stored",): (1, 0),
    ("ports",): (1, 0),
    # Kits bundle the ports of every layer below the dispatcher's: they sit at its layer.
    ("ports", "kit"): (2, 0),
    ("dispatch", "engine"): (2, 0),
    ("dispatch", "drivers"): (2, 1),
    ("dispatch", "extras"): (2, 2),
    ("dispatch", "tools"): (2, 2),
    ("dispatch",): (2, 3),
    ("receive",): (3, 0),
    ("testing",): (3, 0),
    ("observability",): (3, 0),
}
BASE_LAYER = (0, 0)
PACKAGE_LAYER = (9, 0)

SKIPPED_DIRS = {"node_modules", "__pycache__", ".venv", ".git"}


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``target`` at ``line`` of the importer's file."""

    importer: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.target} (line {self.line})"


def discover(repo: Path) -> dict[str, Path]:
    """Every first-party module of the repository: dotted name -> file."""
    modules: dict[str, Path] = {}
    for folder, base in PACKAGE_ROOTS.items():
        top = repo / folder
        for path in sorted(top.rglob("*.py")):
            if SKIPPED_DIRS.intersection(path.relative_to(top).parts):
                continue
            parts = path.relative_to(repo / base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imported(node: ast.ImportFrom, module: str, package: bool) -> tuple[str, list[str]]:
    """``from base import a, b``: the base resolved, and the names it may load."""
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        if not package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([base] if base else [])])
    return base, [f"{base}.{alias.name}" for alias in node.names]


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The first-party module ``name`` loads: itself, else its longest known prefix.

    A first-party name that matches no file is kept as it is (a planted or misspelled
    import still shows as an edge)."""
    if name.split(".")[0] not in RINGS:
        return None
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return name


def _loaded_by_name(call: ast.Call) -> str | None:
    """The literal name of ``importlib.import_module("a.b")`` or ``__import__("a.b")``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def module_edges(name: str, source: str, modules: Mapping[str, Path], package: bool) -> set[Edge]:
    """The first-party imports of one module's source."""
    edges: set[Edge] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            loaded = _loaded_by_name(node)
            if loaded is None:
                continue
            targets = [loaded]
        elif not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            # ``from pkg import name``: the submodule when ``name`` is one, else ``pkg``.
            base, members = _imported(node, name, package)
            targets = [m for m in members if m in modules] or [base]
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != name:
                edges.add(Edge(name, resolved, node.lineno))
    return edges


def edges(modules: Mapping[str, Path]) -> set[Edge]:
    """Every first-party import of every module."""
    found: set[Edge] = set()
    for name, path in modules.items():
        found |= module_edges(name, path.read_text(), modules, is_package(path))
    return found


def ring(module: str) -> int:
    return RINGS[module.split(".")[0]]


def core_layer(module: str) -> tuple[int, int]:
    parts = tuple(module.split(".")[1:])
    if not parts:
        return PACKAGE_LAYER
    for length in (2, 1):
        if parts[:length] in CORE_LAYERS:
            return CORE_LAYERS[parts[:length]]
    return BASE_LAYER


def outward(found: Iterable[Edge]) -> list[str]:
    """The imports that point outward (a ring or a core layer), each with the rule it breaks."""
    wrong: list[str] = []
    for edge in sorted(found, key=str):
        source, target = ring(edge.importer), ring(edge.target)
        top_source, top_target = edge.importer.split(".")[0], edge.target.split(".")[0]
        if target > source:
            wrong.append(f"{edge}: {RING_NAMES[source]} imports {RING_NAMES[target]}")
        elif (
            source == target == ADAPTERS
            and top_source != top_target
            and (top_source, top_target) not in ADAPTER_ALLOWLIST
        ):
            wrong.append(f"{edge}: an adapter imports another adapter")
        elif (
            source == target == CORE
            and edge.target != "docoutbox"
            and core_layer(edge.target) > core_layer(edge.importer)
        ):
            wrong.append(f"{edge}: a core module reaches up a layer")
    return wrong


def cycles(found: Iterable[Edge], pending: Iterable[frozenset[str]] = ()) -> list[str]:
    """Each import cycle, as a path ``a -> b -> ... -> a``; edges between a pair in
    ``pending`` are left out."""
    exempt = set(pending)
    graph: dict[str, set[str]] = {}
    for edge in found:
        if frozenset((edge.importer, edge.target)) not in exempt:
            graph.setdefault(edge.importer, set()).add(edge.target)
    reported: list[str] = []
    seen: set[frozenset[str]] = set()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            loop = [*path[path.index(name) :], name]
            key = frozenset(loop)
            if key not in seen:
                seen.add(key)
                reported.append(" -> ".join(loop))
            return
        if name in done:
            return
        for target in sorted(graph.get(name, ())):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    return reported
