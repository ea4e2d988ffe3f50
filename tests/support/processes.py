"""``python -m docoutbox_app ...`` as a subprocess, with its output in a temporary file or in
pipes the test reads line by line."""

from __future__ import annotations

import queue
import signal as signals
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from tests.support.servers import REPO_ROOT


class CliProcess:
    """One ``docoutbox`` command run from the repository, killed or stopped by the test.

    By default stdout and stderr go to one temporary file (:meth:`output`). With
    ``pipes=True`` they are two text pipes: read them with :meth:`lines` while the command
    runs, or all at once with :meth:`communicate`.
    """

    def __init__(
        self, args: list[str], env: Mapping[str, str] | None = None, *, pipes: bool = False
    ) -> None:
        self.log: IO[bytes] | None = None if pipes else tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        sink: Any = subprocess.PIPE if pipes else self.log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "docoutbox_app", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            text=pipes,
            env=None if env is None else dict(env),
        )

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def wait_started(self, timeout: float = 60) -> None:
        """Wait for the engine's start event: from then on SIGTERM means a clean stop."""
        deadline = time.monotonic() + timeout
        while "dispatcher_started" not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def lines(self, stream: str = "stdout") -> queue.Queue[str]:
        """The lines of the piped ``stream`` ("stdout" or "stderr"), as they come."""
        source: IO[str] | None = getattr(self.proc, stream)
        assert source is not None, f"{stream} is not piped"
        out: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for line in source:
                out.put(line)

        threading.Thread(target=pump, daemon=True).start()
        return out

    def communicate(self, timeout: float = 60, *, signal: int | None = None) -> tuple[str, str]:
        """Send ``signal`` (if any), then the rest of stdout and stderr once the command
        exits; a command still running after ``timeout`` is killed."""
        if signal is not None:
            self.proc.send_signal(signal)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()
        return out or "", err or ""

    def terminate(self, timeout: float = 60) -> tuple[str, str]:
        """SIGTERM, then what the command wrote until it exited."""
        return self.communicate(timeout, signal=signals.SIGTERM)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=60)

    def output(self) -> str:
        assert self.log is not None, "the output is piped"
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.log is not None:
            self.log.close()
