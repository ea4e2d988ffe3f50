"""The repository's import graph: imports point inward only, and nothing loops.

Every top-level package is read (the core, each adapter, the application ring,
``benchmarks``, ``examples`` and ``tests``), imports inside functions included; the rings
and the core's layers are stated in :mod:`tests.support.layers`. The planted-violation
tests show that the checker fails on what it must catch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import layers
from tests.support.layers import Edge

REPO = Path(__file__).resolve().parents[2]

#: Import cycles still being taken apart, each a pair of modules importing each other
#: (none now; :func:`test_pending_cycles_are_still_cycles` keeps an entry honest).
PENDING_CYCLES: frozenset[frozenset[str]] = frozenset()

#: Fewest modules the walk must find in each ring (a guard against an empty walk).
MINIMUM_MODULES = {
    layers.CORE: 50,
    layers.ADAPTERS: 38,
    layers.APPLICATION: 10,
    layers.OUTER: 24,
    layers.TESTS: 120,
}


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return layers.discover(REPO)


@pytest.fixture(scope="module")
def edges(modules: dict[str, Path]) -> set[Edge]:
    return layers.edges(modules)


def test_no_import_points_outward(edges: set[Edge]) -> None:
    wrong = layers.outward(edges)
    assert wrong == [], "imports pointing outward:\n" + "\n".join(wrong)


def test_import_graph_has_no_cycles(edges: set[Edge]) -> None:
    found = layers.cycles(edges, PENDING_CYCLES)
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_pending_cycles_are_still_cycles(edges: set[Edge]) -> None:
    pairs = {(e.importer, e.target) for e in edges}
    for pending in PENDING_CYCLES:
        first, second = sorted(pending)
        assert (first, second) in pairs and (second, first) in pairs, (
            f"{first} and {second} no longer import each other: remove them from PENDING_CYCLES"
        )


def test_the_walk_sees_every_package_and_module(modules: dict[str, Path], edges: set[Edge]) -> None:
    files = [
        p
        for folder in layers.PACKAGE_ROOTS
        for p in (REPO / folder).rglob("*.py")
        if not layers.SKIPPED_DIRS.intersection(p.relative_to(REPO).parts)
    ]
    assert len(modules) == len(files)
    assert {name.split(".")[0] for name in modules} == set(layers.RINGS)
    for ring, least in MINIMUM_MODULES.items():
        count = sum(1 for name in modules if layers.ring(name) == ring)
        assert count >= least, f"{layers.RING_NAMES[ring]}: {count} modules, expected {least}+"
    importers = {e.importer for e in edges}
    assert {name.split(".")[0] for name in importers} == set(layers.RINGS)
    # Imports inside functions count (here, one loading an optional SDK on use).
    pairs = {(e.importer, e.target) for e in edges}
    assert ("docoutbox_spark.readers", "docoutbox_cosmos.errors") in pairs
    assert len(edges) >= 1000


def _planted(modules: dict[str, Path], name: str, extra: str) -> list[str]:
    """The outward imports of the real module ``name`` with ``extra`` appended to it."""
    path = modules[name]
    source = path.read_text() + "\n\n" + extra
    return layers.outward(layers.module_edges(name, source, modules, layers.is_package(path)))


def test_a_function_level_adapter_import_in_the_core_fails(modules: dict[str, Path]) -> None:
    assert _planted(modules, "docoutbox.store.core", "") == []
    wrong = _planted(
        modules, "docoutbox.store.core", "def planted():\n    import docoutbox_mongo\n"
    )
    assert len(wrong) == 1
    assert wrong[0].startswith("docoutbox.store.core -> docoutbox_mongo (line ")
    assert wrong[0].endswith("core imports adapter")


def test_an_application_import_in_the_core_fails_even_when_only_for_types(
    modules: dict[str, Path],
) -> None:
    planted = "if TYPE_CHECKING:\n    from docoutbox_app.cli import options\n"
    wrong = _planted(modules, "docoutbox.dispatch.engine.loop", planted)
    assert [w.split(" (")[0] for w in wrong] == [
        "docoutbox.dispatch.engine.loop -> docoutbox_app.cli.options"
    ]
    assert wrong[0].endswith("core imports application")


def test_a_benchmark_importing_the_tests_fails(modules: dict[str, Path]) -> None:
    planted = (
        "try:\n    from tests.support import backends\nexcept ImportError:\n    backends = None\n"
    )
    wrong = _planted(modules, "benchmarks.common", planted)
    assert [w.split(" (")[0] for w in wrong] == ["benchmarks.common -> tests.support.backends"]
    assert wrong[0].endswith("benchmarks/examples imports tests")


def test_relative_imports_are_resolved_and_core_layers_checked(modules: dict[str, Path]) -> None:
    planted = (
        "def planted():\n    from ..extras import immediate\n    from ..drivers import threads\n"
    )
    wrong = _planted(modules, "docoutbox.dispatch.engine.flow", planted)
    assert [w.split(" (")[0] for w in wrong] == [
        "docoutbox.dispatch.engine.flow -> docoutbox.dispatch.drivers.threads",
        "docoutbox.dispatch.engine.flow -> docoutbox.dispatch.extras.immediate",
    ]
    assert all(w.endswith("a core module reaches up a layer") for w in wrong)
    assert _planted(modules, "docoutbox.dispatch.drivers.threads", "from . import ownership") == []


def test_a_module_loaded_by_name_counts(modules: dict[str, Path]) -> None:
    planted = 'def planted():\n    return importlib.import_module("docoutbox_cosmos.kit")\n'
    wrong = _planted(modules, "docoutbox.dispatch.drivers.threads", planted)
    assert [w.split(" (")[0] for w in wrong] == [
        "docoutbox.dispatch.drivers.threads -> docoutbox_cosmos.kit"
    ]


def test_an_adapter_importing_another_adapter_fails(modules: dict[str, Path]) -> None:
    wrong = _planted(modules, "docoutbox_kafka.publisher", "import docoutbox_rabbitmq.amqp\n")
    assert [w.split(" (")[0] for w in wrong] == [
        "docoutbox_kafka.publisher -> docoutbox_rabbitmq.amqp"
    ]


def test_a_cycle_through_a_function_level_import_fails(
    modules: dict[str, Path], edges: set[Edge]
) -> None:
    path = modules["docoutbox.model"]
    source = path.read_text() + "\n\ndef planted():\n    from docoutbox.store import core\n"
    model = layers.module_edges("docoutbox.model", source, modules, package=False)
    planted = {e for e in edges if e.importer != "docoutbox.model"} | model
    found = layers.cycles(planted, PENDING_CYCLES)
    assert found and all("docoutbox.model -> docoutbox.store.core" in c for c in found)
    # The pending pairs are exempt, and only they.
    assert {frozenset(c.split(" -> ")) for c in layers.cycles(edges)} == set(PENDING_CYCLES)


def test_the_checker_reads_a_tree_of_its_own(tmp_path: Path) -> None:
    for folder in layers.PACKAGE_ROOTS:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "docoutbox" / "model.py").write_text(
        "class Model:\n    def load(self):\n        from docoutbox_app import main\n"
    )
    (tmp_path / "benchmarks" / "run.py").write_text("import tests.support\nimport examples\n")
    found = layers.edges(layers.discover(tmp_path))
    assert sorted(map(str, found)) == [
        "benchmarks.run -> examples (line 2)",
        "benchmarks.run -> tests (line 1)",
        "docoutbox.model -> docoutbox_app (line 3)",
    ]
    assert layers.outward(found) == [
        "benchmarks.run -> tests (line 1): benchmarks/examples imports tests",
        "docoutbox.model -> docoutbox_app (line 3): core imports application",
    ]


def test_an_example_importing_the_tests_fails(modules: dict[str, Path], edges: set[Edge]) -> None:
    """The examples' tests live in ``tests/examples``: an example module, test-like name or
    not, is in the outer ring and may not import ``tests``."""
    assert layers.ring("examples.bank.test_app") == layers.OUTER
    assert layers.ring("tests.examples.test_bank") == layers.TESTS
    source = "from tests.support.required import missing\n"
    planted = layers.module_edges("examples.bank.test_app", source, modules, package=False)
    wrong = layers.outward(planted)
    assert wrong and all("examples.bank.test_app -> tests.support.required" in w for w in wrong)
