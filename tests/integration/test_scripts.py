"""The README's main command, ``scripts/demo``, as a new user runs it (without the Spark
audit, which ``tests/spark/test_demo_audit.py`` covers)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.servers import REPO_ROOT

pytestmark = pytest.mark.wire


def test_the_demo_script_runs_on_the_embedded_server() -> None:
    done = subprocess.run(
        ["scripts/demo", "--no-audit"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "exactly once: yes" in done.stdout, done.stdout[-2000:]
