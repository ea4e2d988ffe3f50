"""The unit tier's sources read no wall clock and start no thread or event loop.

``conftest.py`` refuses sockets, thread starts and sleeps while a unit test runs; reading
the clock cannot be refused that way (logging and the library's default clocks read it),
so this test reads the tier's sources instead: no call of ``time.time``,
``time.monotonic``, ``time.perf_counter``, ``datetime.now``, ``utcnow``, ``asyncio.run``
or ``new_event_loop``, and no ``threading`` import. A test that needs them belongs in
``tests/integration/``; one that needs time gets an injected clock.

The tiers run in one pytest process (``scripts/test``), the unit tier last: a thread an
earlier tier leaves running (a MongoDB client's monitors) sleeps inside it and trips the
guard. So no session-wide fixture of the suite holds a MongoDB client open across its
``yield``, the Spark session ends with the Spark tier (package scope, its py4j gateway
shut down), and the guard names the thread it stopped.
"""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from tests.support import loopless
from tests.unit.conftest import FORBIDDEN, ForbiddenInUnitTests

UNIT = Path(__file__).parent
TESTS = UNIT.parent
#: Fixture scopes that outlive a tier.
WIDE = {"session", "package"}
CLIENTS = {"MongoClient", "AsyncMongoClient", "AsyncIOMotorClient"}
#: Calls that start a Spark session (``docoutbox_spark.readers.session``, the builder).
SPARK_STARTS = {"session", "getOrCreate"}
#: Attribute calls that read the wall clock or start a loop, as ``owner.name``.
CALLS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "sleep"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("asyncio", "run"),
    ("asyncio", "new_event_loop"),
    ("asyncio", "get_event_loop"),
}
#: Names that read the clock however they are imported.
NAMES = {"utcnow", "perf_counter", "monotonic"}
MODULES = {"threading", "concurrent.futures", "socket"}


def offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id, func.attr) in CALLS:
                    found.append(f"{where}: {func.value.id}.{func.attr}()")
            elif isinstance(func, ast.Name) and func.id in NAMES:
                found.append(f"{where}: {func.id}()")
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name in MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
            found.append(f"{where}: from {node.module} import ...")
    return found


def test_no_unit_test_reads_the_clock_or_starts_a_thread_or_loop() -> None:
    own = {"conftest.py", Path(__file__).name}
    sources = sorted(p for p in UNIT.glob("*.py") if p.name not in own)
    assert len(sources) > 30
    found = [o for p in sources for o in offences(p)]
    assert found == []


def test_the_check_sees_each_kind_of_offence(tmp_path: Path) -> None:
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "import threading\nimport time\nfrom datetime import datetime\n"
        "from docoutbox.store.document import utcnow\n"
        "t = time.monotonic()\nd = datetime.now()\nu = utcnow()\n"
    )
    assert len(offences(planted)) == 4


class _Waits:
    """An awaitable that hands its caller something to wait on, as a future does."""

    def __await__(self) -> Generator[str, None, None]:
        yield "a future"


def test_loopless_runs_a_coroutine_that_only_yields_and_refuses_one_that_waits() -> None:
    async def yields() -> int:
        await asyncio.sleep(0)  # a bare yield: no loop needed
        return 7

    async def waits() -> None:
        await _Waits()

    assert loopless.run(yields()) == 7
    with pytest.raises(loopless.NeedsLoop, match="a future"):
        loopless.run(waits())


@pytest.mark.parametrize(("owner", "name", "what"), FORBIDDEN)
def test_the_tier_refuses_each_forbidden_call(owner: Any, name: str, what: str) -> None:
    with pytest.raises(ForbiddenInUnitTests, match=name):
        getattr(owner, name)()


def _scope(decorator: ast.expr) -> str | None:
    if isinstance(decorator, ast.Call):
        for keyword in decorator.keywords:
            if keyword.arg == "scope" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
    return None


def _opens_client(node: ast.AST) -> bool:
    return _calls(node, CLIENTS)


def _calls(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` calls a function or method named in ``names``."""
    return any(
        isinstance(n, ast.Call)
        and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) in names
        for n in ast.walk(node)
    )


def _has_yield(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(node))


def held_clients(path: Path) -> list[str]:
    """Session- or package-scoped fixtures of ``path`` that open a MongoDB client before
    their ``yield`` without closing it first (outside a ``with`` that ends before it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef) or not _has_yield(node):
            continue
        if not any(_scope(d) in WIDE for d in node.decorator_list):
            continue
        for statement in node.body:
            if _has_yield(statement):
                if isinstance(statement, ast.With) and any(
                    _opens_client(item.context_expr) for item in statement.items
                ):
                    found.append(f"{path.name}:{statement.lineno}: {node.name}")
                break
            if not isinstance(statement, ast.With) and _opens_client(statement):
                found.append(f"{path.name}:{statement.lineno}: {node.name}")
    return found


def test_no_session_wide_fixture_holds_a_mongodb_client_open() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert len(sources) > 100
    assert [h for p in sources for h in held_clients(p)] == []


def test_the_check_sees_a_client_held_across_the_yield(tmp_path: Path) -> None:
    planted = tmp_path / "conftest.py"
    planted.write_text(
        "import pytest\nfrom pymongo import MongoClient\n\n"
        '@pytest.fixture(scope="session")\ndef held():\n'
        "    client = MongoClient('mongodb://x')\n    yield client\n    client.close()\n\n"
        '@pytest.fixture(scope="package")\ndef within():\n'
        "    with MongoClient('mongodb://x') as client:\n        yield client\n\n"
        '@pytest.fixture(scope="session")\ndef closed():\n'
        "    with MongoClient('mongodb://x') as client:\n        client.ping()\n"
        "    yield 'name'\n\n"
        "@pytest.fixture\ndef per_test():\n"
        "    client = MongoClient('mongodb://x')\n    yield client\n    client.close()\n"
    )
    assert [h.split(": ")[1] for h in held_clients(planted)] == ["held", "within"]


def spark_sessions_left_running(path: Path) -> list[str]:
    """Fixtures of ``path`` that start a Spark session and let its py4j threads outlive the
    Spark tier: session-scoped ones (the unit tier runs after it, in the same session), and
    package-scoped ones whose teardown does not end it with
    :func:`tests.support.spark.end_session` (``SparkSession.stop`` keeps the gateway)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef) or not _has_yield(node):
            continue
        scopes = {_scope(d) for d in node.decorator_list} & WIDE
        if not scopes:
            continue
        split = next(i for i, s in enumerate(node.body) if _has_yield(s))
        if not any(_calls(s, SPARK_STARTS) for s in node.body[: split + 1]):
            continue
        if "session" in scopes or not any(
            _calls(s, {"end_session"}) for s in node.body[split + 1 :]
        ):
            found.append(f"{path.name}:{node.lineno}: {node.name}")
    return found


def test_no_spark_session_outlives_the_spark_tier() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert [h for p in sources for h in spark_sessions_left_running(p)] == []


def test_the_check_sees_a_spark_session_left_running(tmp_path: Path) -> None:
    planted = tmp_path / "conftest.py"
    planted.write_text(
        "import pytest\nfrom docoutbox_spark.readers import session\n"
        "from tests.support.spark import end_session\n\n"
        '@pytest.fixture(scope="session")\ndef whole_run():\n'
        "    spark = session()\n    yield spark\n    end_session(spark)\n\n"
        '@pytest.fixture(scope="package")\ndef stopped_only():\n'
        "    spark = SparkSession.builder.getOrCreate()\n    yield spark\n    spark.stop()\n\n"
        '@pytest.fixture(scope="package")\ndef ended():\n'
        "    spark = session()\n    yield spark\n    end_session(spark)\n\n"
        "@pytest.fixture\ndef per_test():\n"
        "    spark = session()\n    yield spark\n    spark.stop()\n"
    )
    found = [h.split(": ")[1] for h in spark_sessions_left_running(planted)]
    assert found == ["whole_run", "stopped_only"]


def test_a_refused_call_on_a_thread_left_running_names_the_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Leaked:
        name = "pymongo_server_monitor_thread"

        def _target(self) -> None:
            """What the thread runs."""

    monkeypatch.setattr(threading, "current_thread", Leaked)
    with pytest.raises(ForbiddenInUnitTests) as refused:
        time.sleep(0.5)
    assert "'pymongo_server_monitor_thread' (tests.unit.test_tier_rules." in str(refused.value)
    assert "Leaked._target), which was running before" in str(refused.value)
