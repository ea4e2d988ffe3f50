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
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from docoutbox.testing.process import ServerProcess

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


class MongoWireServer(ServerProcess):
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

    title = "MongoDB wire server"

    def __init__(
        self,
        *,
        lib: Path | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.lib = lib or default_lib()

    @property
    def uri(self) -> str:
        """Connection string; ``directConnection`` skips replica-set discovery."""
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def unavailable(self) -> str | None:
        return mongo_wire_server_available(self.lib)

    def command(self) -> list[str]:
        java = shutil.which("java")
        assert java is not None
        return [java, "-cp", f"{self.lib}/*", str(LAUNCHER), "0"]

    def ready_port(self, line: str) -> int | None:
        return int(line.split()[1]) if line.startswith("READY ") else None


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
