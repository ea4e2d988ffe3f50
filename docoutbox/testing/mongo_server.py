"""An in-memory MongoDB wire-protocol server for tests, started in-process.

``de.bwaldvogel:mongo-java-server`` in a Java subprocess (Java 17+): about a second to
start, a private instance per test session, gone with the process that started it::

    python -m docoutbox.testing.mongo_server install      # once: jars via Maven

    from docoutbox.testing.mongo_server import MongoWireServer

    with MongoWireServer() as server:
        client = pymongo.MongoClient(server.uri, uuidRepresentation="standard")

The jars go to ``$DOCOUTBOX_MONGO_WIRE_LIB`` or ``~/.cache/docoutbox/mongo-wire``.
Standard library only.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Self

HERE = Path(__file__).resolve().parent / "mongo_wire"
LAUNCHER: Path = HERE / "MongoWireServer.java"
POM: Path = HERE / "pom.xml"
LIB_ENV = "DOCOUTBOX_MONGO_WIRE_LIB"

_INSTALL_HINT = "run: python -m docoutbox.testing.mongo_server install"


def default_lib() -> Path:
    """Where the jars are: ``$DOCOUTBOX_MONGO_WIRE_LIB``, else a per-user cache."""
    configured = os.environ.get(LIB_ENV)
    if configured:
        return Path(configured)
    return (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "docoutbox"
        / "mongo-wire"
    )


def _mongo_jar(lib: Path) -> Path | None:
    jars = sorted(lib.glob("mongo-java-server-[0-9]*.jar"))
    return jars[0] if jars else None


def mongo_wire_server_available(lib: Path | None = None) -> str | None:
    """Return None when the wire server can be launched, else a human-readable reason."""
    lib = lib or default_lib()
    if shutil.which("java") is None:
        return "java is not on PATH (Java 17+ is needed for the MongoDB wire server)"
    if not LAUNCHER.is_file():
        return f"launcher {LAUNCHER} is missing"
    if _mongo_jar(lib) is None:
        return f"mongo-java-server jar not found in {lib}; {_INSTALL_HINT}"
    return None


def install_mongo_wire_server(lib: Path | None = None) -> Path:
    """Fetch mongo-java-server and its dependencies into ``lib`` with Maven (idempotent).

    Needs ``mvn`` and Maven Central. Returns the directory. Raises RuntimeError with
    Maven's output if it fails.
    """
    lib = (lib or default_lib()).resolve()
    if _mongo_jar(lib) is not None:
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("mvn (Maven) is needed to fetch mongo-java-server")
    lib.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="docoutbox-mongo-wire-") as work:
        pom = Path(work) / "pom.xml"
        shutil.copyfile(POM, pom)
        done = subprocess.run(
            [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
             f"-DoutputDirectory={lib}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    if done.returncode != 0 or _mongo_jar(lib) is None:
        raise RuntimeError(
            f"Maven could not fetch mongo-java-server into {lib}:\n{done.stdout}{done.stderr}"
        )
    return lib


class MongoWireServer:
    """An in-memory MongoDB-compatible server (mongo-java-server) in a Java subprocess.

    Fetch the jars once (``python -m docoutbox.testing.mongo_server install``), then::

        with MongoWireServer() as server:
            client = pymongo.MongoClient(server.uri, uuidRepresentation="standard")

    The server reports MongoDB 6.0 / wire version 17 and has its oplog enabled, so change
    streams work (pass ``start_at_operation_time`` on the first ``watch()``). Its gaps
    against a real MongoDB are listed in the project's ``tests/README.md``. The process
    exits when its stdin is closed, so it also dies with the Python process that started
    it.
    """

    def __init__(
        self,
        *,
        lib: Path | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.lib = lib or default_lib()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("MongoWireServer is not running; call start() first")
        return self._port

    @property
    def uri(self) -> str:
        """Connection string; ``directConnection`` skips replica-set discovery."""
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        with self._lock:
            if self._proc is not None:
                return self
            reason = mongo_wire_server_available(self.lib)
            if reason is not None:
                raise RuntimeError(f"cannot start the MongoDB wire server: {reason}")
            java = shutil.which("java")
            assert java is not None
            # stderr goes to a file: an unread pipe could fill up and block the server.
            self._stderr = tempfile.TemporaryFile(  # noqa: SIM115 - closed in stop()
                prefix="mongo-wire-server-", suffix=".err"
            )
            cmd = [java, "-cp", f"{self.lib}/*", str(LAUNCHER), "0"]
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
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

        threading.Thread(target=pump, name="mongo-wire-server-stdout", daemon=True).start()
        try:
            while True:
                line = lines.get(timeout=self.startup_timeout)
                if line is None:
                    code = proc.wait(timeout=self.stop_timeout)
                    raise RuntimeError(
                        f"MongoDB wire server exited with code {code} before it was ready."
                        f"\nstderr:\n{self._read_stderr()}"
                    )
                text = line.decode("utf-8", "replace").strip()
                if text.startswith("READY "):
                    return int(text.split()[1])
        except queue.Empty:
            raise RuntimeError(
                f"MongoDB wire server was not ready within {self.startup_timeout:.0f}s."
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
                    proc.stdin.close()  # EOF on stdin makes the launcher shut down
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
        return f"<MongoWireServer {state}>"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m docoutbox.testing.mongo_server",
        description="Fetch or run the in-memory MongoDB wire server.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="fetch the jars with Maven")
    install.add_argument("--lib", type=Path, help=f"where (default: ${LIB_ENV} or the cache)")
    run = sub.add_parser("run", help="run one until interrupted; prints its URI")
    run.add_argument("--lib", type=Path)
    args = parser.parse_args(argv)
    if args.command == "install":
        try:
            print(install_mongo_wire_server(args.lib))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    with MongoWireServer(lib=args.lib) as server:
        print(server.uri, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
