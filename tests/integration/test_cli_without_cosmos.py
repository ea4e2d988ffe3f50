"""The ``docoutbox`` command works with only the MongoDB and Spark extras installed, as
``scripts/demo`` installs them: urllib3 comes with azure-cosmos (the ``cosmos`` extra),
and the other extras' packages are absent too. A child process hides them from the import
system and runs the command's entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The top-level packages of the extras ``scripts/demo`` does not install.
OTHER_EXTRAS = (
    "urllib3",
    "azure",
    "aiohttp",
    "pika",
    "aio_pika",
    "pamqp",
    "confluent_kafka",
    "opentelemetry",
    "prometheus_client",
    "cryptography",
    "faststream",
    "starlette",
    "uvicorn",
)

HIDDEN = f"""
import sys
for package in {OTHER_EXTRAS!r}:
    sys.modules[package] = None  # as if its extra were not installed
from docoutbox_app.cli import main
sys.exit(main(sys.argv[1:]))
"""


COMMANDS = ("demo", "audit", "export", "dispatch", "outbox", "dead-letters", "leases", "run")


@pytest.mark.parametrize("command", [["--help"], *([c, "--help"] for c in COMMANDS)])
def test_the_command_starts_with_only_the_demo_extras(command: list[str]) -> None:
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
