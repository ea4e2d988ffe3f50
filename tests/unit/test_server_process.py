"""The shared launcher of the test servers: ready on its port line, errors that quote
stderr, stopped by closing stdin."""

from __future__ import annotations

import sys

import pytest

from docoutbox.testing.process import ServerProcess

SERVES = "import sys; print('noise'); print('READY 4242', flush=True); sys.stdin.read()"


class Script(ServerProcess):
    title = "script server"

    def __init__(self, code: str, *, reason: str | None = None, timeout: float = 10) -> None:
        super().__init__(startup_timeout=timeout, stop_timeout=5)
        self.code = code
        self.reason = reason

    def unavailable(self) -> str | None:
        return self.reason

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]

    def ready_port(self, line: str) -> int | None:
        return int(line.split()[1]) if line.startswith("READY ") else None


def test_an_unavailable_server_is_not_launched() -> None:
    with pytest.raises(RuntimeError, match="cannot start the script server: no java"):
        Script(SERVES, reason="no java").start()
