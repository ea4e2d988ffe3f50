"""CI detection and the end-of-run summary of skipped tests (tests/conftest.py).

Each test runs pytest in a child process; the pure checks of ``truthy`` are in
``tests/unit/test_ci_flags.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_terminal_summary  # noqa: F401\n"
    )
    (tmp_path / "test_gap.py").write_text(
        "from tests.conftest import missing\n\n"
        "def test_needs_a_server():\n"
        "    missing('the frobnicator is not running')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "DOCOUTBOX_REQUIRE_SERVERS"}}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_skips_are_summarized_loudly(tmp_path: Path) -> None:
    run = _run(tmp_path, ci=None)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SKIPPED: 1 tests did not run" in run.stdout
    assert "1 x the frobnicator is not running" in run.stdout


def test_ci_1_turns_a_missing_server_into_a_failure(tmp_path: Path) -> None:
    run = _run(tmp_path, ci="1")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "required server missing: the frobnicator is not running" in run.stdout
