"""``python -m docoutbox ...`` as a subprocess, with its output in a temporary file."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import IO

from tests.support.servers import REPO_ROOT


class CliProcess:
    """One ``docoutbox`` command run from the repository, killed or stopped by the test."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None = None) -> None:
        self.log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "docoutbox", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            env=None if env is None else dict(env),
        )

    def wait_started(self, timeout: float = 60) -> None:
        """Wait for the engine's start event: from then on SIGTERM means a clean stop."""
        deadline = time.monotonic() + timeout
        while "dispatcher_started" not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=60)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.log.close()
