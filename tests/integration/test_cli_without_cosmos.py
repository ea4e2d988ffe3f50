"""The ``docoutbox`` command works with only the MongoDB extra installed: urllib3 comes
with azure-cosmos (the ``cosmos`` extra), and ``scripts/demo`` installs
``[mongodb,spark]``. A child process hides urllib3 from the import system and runs the
command's entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HIDDEN = """
import sys
sys.modules["urllib3"] = None  # as if the cosmos extra were not installed
from docoutbox_app.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "command", [["--help"], ["demo", "--help"], ["dispatch", "--help"], ["outbox", "--help"]]
)
def test_the_command_starts_without_urllib3(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_the_quiet_tls_switch_is_harmless_without_urllib3() -> None:
    script = """
import sys, warnings
sys.modules["urllib3"] = None
from docoutbox_app.logs import quiet_unverified_tls
before = list(warnings.filters)
quiet_unverified_tls()
print("unchanged" if warnings.filters == before else "changed")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "unchanged" in done.stdout
