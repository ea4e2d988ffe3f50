"""The unit tier's sources read no wall clock and start no thread or event loop.

``conftest.py`` refuses sockets, thread starts and sleeps while a unit test runs; reading
the clock cannot be refused that way (logging and the library's default clocks read it),
so this test reads the tier's sources instead: no call of ``time.time``,
``time.monotonic``, ``time.perf_counter``, ``datetime.now``, ``utcnow``, ``asyncio.run``
or ``new_event_loop``, and no ``threading`` import. A test that needs them belongs in
``tests/integration/``; one that needs time gets an injected clock.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from tests.support import loopless
from tests.unit.conftest import FORBIDDEN, ForbiddenInUnitTests

UNIT = Path(__file__).parent
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
