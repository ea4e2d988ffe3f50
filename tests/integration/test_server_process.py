"""The shared launcher of the test servers: ready on its port line, errors that quote
stderr, stopped by closing stdin.

Here: the launcher starting real child processes; the pure parts are in
``tests/unit/test_server_process.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.test_server_process import SERVES, Script

DIES = "import sys; print('boom: no port', file=sys.stderr); sys.exit(3)"
HANGS = "import sys; sys.stdin.read()"


def test_ready_on_the_port_line_and_stopped_by_closing_stdin() -> None:
    server = Script(SERVES)
    with server:
        assert server.port == 4242
        assert server.running
        proc = server._proc
        assert server.start() is server  # starting twice keeps the one process
    assert not server.running
    assert proc is not None and proc.returncode == 0  # it exited on EOF, not on a signal
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.port


def test_an_early_exit_quotes_the_exit_code_and_stderr() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*boom: no port"):
        Script(DIES).start()


def test_no_port_line_in_time_is_an_error_and_the_process_is_stopped() -> None:
    server = Script(HANGS, timeout=0.5)
    with pytest.raises(RuntimeError, match="not ready within"):
        server.start()
    assert not server.running and server._proc is None


def test_the_readme_command_for_the_wire_server_runs_without_a_warning() -> None:
    """``python -m docoutbox.testing.mongo_server`` warned (runpy) on every run, because
    importing ``docoutbox.testing`` imported the module it was about to run."""

    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "docoutbox.testing.mongo_server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "install" in done.stdout
    assert "Warning" not in done.stderr
