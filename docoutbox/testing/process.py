"""A test server in a subprocess: started once, ready when it prints its port, stopped
by closing its stdin.

:class:`ServerProcess` is the launcher the project's test servers share (the MongoDB wire
server here, the local Cosmos DB server in the test suite). A subclass says how to check
that it can run, which command starts it, and which stdout line announces the port.
Standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self


class ServerProcess:
    """A server subprocess that exits when its stdin is closed.

    So it also dies with the Python process that started it. Its stderr goes to a
    temporary file (an unread pipe could fill up and block the server) and is quoted in
    the error when the server exits or is not ready in time.
    """

    #: The server's name in messages.
    title = "server"

    def __init__(self, *, startup_timeout: float, stop_timeout: float) -> None:
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._lock = threading.Lock()

    # What a subclass provides.

    def unavailable(self) -> str | None:
        """None when the server can be launched, else a human-readable reason."""
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready_port(self, line: str) -> int | None:
        """The port announced by this stdout line, or None if it announces nothing."""
        raise NotImplementedError

    def environment(self) -> Mapping[str, str] | None:
        return None

    def workdir(self) -> Path | None:
        return None

    # The shared lifecycle.

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        with self._lock:
            if self._proc is not None:
                return self
            reason = self.unavailable()
            if reason is not None:
                raise RuntimeError(f"cannot start the {self.title}: {reason}")
            self._stderr = tempfile.TemporaryFile(  # noqa: SIM115 - closed in stop()
                prefix=f"{type(self).__name__}-", suffix=".err"
            )
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                cwd=self.workdir(),
                env=self.environment(),
            )
            self._proc = proc
            atexit.register(self.stop)
            try:
                self._port = self._wait_ready(proc)
            except BaseException:
                self._stop_locked()
                raise
            return self

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> int:
        assert proc.stdout is not None
        lines: queue.Queue[bytes | None] = queue.Queue()
        stdout = proc.stdout

        def pump() -> None:
            # Hand over every stdout line and keep draining until EOF.
            for line in iter(stdout.readline, b""):
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, name=f"{self.title}-stdout", daemon=True).start()
        try:
            while True:
                line = lines.get(timeout=self.startup_timeout)
                if line is None:
                    code = proc.wait(timeout=self.stop_timeout)
                    raise RuntimeError(
                        f"{self.title} exited with code {code} before it was ready."
                        f"\nstderr:\n{self._read_stderr()}"
                    )
                port = self.ready_port(line.decode("utf-8", "replace").strip())
                if port is not None:
                    return port
        except queue.Empty:
            raise RuntimeError(
                f"{self.title} was not ready within {self.startup_timeout:.0f}s."
                f"\nstderr:\n{self._read_stderr()}"
            ) from None

    def _read_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace").strip()

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        self._port = None
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # EOF on stdin makes the server exit
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self._port}" if self._port is not None else "stopped"
        return f"<{type(self).__name__} {state}>"
