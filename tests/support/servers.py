"""Test servers: the in-memory MongoDB wire server, a local Cosmos DB server, RabbitMQ.

The MongoDB wire server is :mod:`docoutbox.testing.mongo_server` (shipped, so users can
start it too); the suite keeps its jars in ``tests/servers/mongo/lib``, fetched by
``scripts/servers.sh install-mongo``. RabbitMQ is started by
``scripts/servers.sh start-rabbitmq``. The Cosmos DB server is ``@vercel/cosmosdb-server``
with the project's patch (see ``tests/servers/cosmos``), installed by
``scripts/servers.sh install-cosmos``. Only the standard library is imported at module
level; pika and azure-cosmos are imported lazily.

Fidelity gaps of the wire server versus real MongoDB are listed in ``tests/README.md``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docoutbox.testing.mongo_server import MongoWireServer as _MongoWireServer
from docoutbox.testing.mongo_server import mongo_wire_server_available as _available
from docoutbox.testing.process import ServerProcess

REPO_ROOT: Path = Path(__file__).resolve().parents[2]
MONGO_LIB: Path = REPO_ROOT / "tests" / "servers" / "mongo" / "lib"

DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBITMQ_URL_ENV = "DOCOUTBOX_RABBITMQ_URL"


class MongoWireServer(_MongoWireServer):
    """:class:`docoutbox.testing.mongo_server.MongoWireServer` over the repository's jars."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("lib", MONGO_LIB)
        super().__init__(**options)


def mongo_wire_server_available() -> str | None:
    """Return None when the wire server can be launched, else a human-readable reason."""
    return _available(MONGO_LIB)


def rabbitmq_url() -> str:
    """The broker URL: ``$DOCOUTBOX_RABBITMQ_URL`` or the local guest account."""
    return os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL


def rabbitmq_available(url: str, timeout: float = 3.0) -> str | None:
    """Return None when a pika BlockingConnection to ``url`` succeeds, else the reason."""
    try:
        import pika  # type: ignore[import-untyped, unused-ignore]
        import pika.exceptions  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return "pika is not installed"
    try:
        params = pika.URLParameters(url)
    except ValueError as exc:
        return f"invalid RabbitMQ URL {url!r}: {exc}"
    params.connection_attempts = 1
    params.retry_delay = 0
    params.socket_timeout = timeout
    params.stack_timeout = timeout
    params.blocked_connection_timeout = timeout
    try:
        connection = pika.BlockingConnection(params)
    except (pika.exceptions.AMQPError, OSError) as exc:
        where = f"{params.host}:{params.port}"
        return f"RabbitMQ not reachable at {where}: {exc!r}"
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection.close()
    return None


# --- Cosmos DB ---------------------------------------------------------------------------

COSMOS_DIR: Path = REPO_ROOT / "tests" / "servers" / "cosmos"
COSMOS_CLI: Path = COSMOS_DIR / "node_modules" / "@vercel" / "cosmosdb-server" / "lib" / "cli.js"
COSMOS_WATCHDOG: Path = COSMOS_DIR / "exit-on-stdin-eof.js"
COSMOS_ENDPOINT_ENV = "COSMOS_ENDPOINT"
COSMOS_KEY_ENV = "COSMOS_KEY"
#: Read by the patched server: how many feed ranges (partition key ranges) a container has.
COSMOS_FEED_RANGES_ENV = "COSMOSDB_SERVER_FEED_RANGES"
DEFAULT_COSMOS_FEED_RANGES = 4
#: The local server does not check signatures; the SDK only needs a valid base64 key.
#: This is the well-known key of the official emulator, not a secret.
EMULATOR_KEY = (
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
)
_COSMOS_READY = re.compile(r"Ready to accept HTTPS? connections at (\S+):(\d+)")


def cosmos_server_available() -> str | None:
    """Return None when the local Cosmos DB server can be launched, else the reason."""
    if shutil.which("node") is None:
        return "node is not on PATH (Node 20+ is needed for the Cosmos DB server)"
    if not COSMOS_CLI.is_file():
        return f"{COSMOS_CLI} is missing; run: scripts/servers.sh install-cosmos"
    return None


@dataclass(frozen=True)
class CosmosAccount:
    """Where a Cosmos DB account is and how the SDK must connect to it.

    ``client_kwargs`` go to ``azure.cosmos.CosmosClient`` and ``azure.cosmos.aio.CosmosClient``
    alike. ``emulated`` is True for the local server (its fidelity gaps are listed in
    ``tests/README.md``), whether launched here or reached through an ``http://``
    ``COSMOS_ENDPOINT``; False for a real account or the official emulator.
    """

    endpoint: str
    key: str
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    emulated: bool = False

    def inject_fault(self, **fault: Any) -> None:
        """Make the local server misbehave for the next matching request(s).

        Keys (all optional): ``status`` (answered instead of the server, with
        ``retryAfterMs``/``substatus`` as x-ms-retry-after-ms/x-ms-substatus), ``delayMs``,
        ``dropRequest`` (close the connection, nothing applied), ``dropReply`` (apply, then
        close the connection instead of answering), ``count`` (default 1), and the filters
        ``method``, ``pathContains`` and ``headers`` (a dict). Faults apply to every client
        of the server: use them in tests that own the server or the only traffic on it.
        Only the local server supports this; a real account raises RuntimeError.
        """
        self._faults("POST", fault)

    def clear_faults(self) -> None:
        """Remove the faults not yet used up."""
        self._control("DELETE", "_faults", None)

    def split_feed_range(self, database: str, container: str, range_id: str) -> list[str]:
        """Split one partition key range of the local server in two, as Cosmos splits a
        physical partition; returns the children's ids. Requests for the gone range get
        410/1002 and the SDK moves continuations to the children."""
        body = {"database": database, "container": container, "range": range_id}
        children: list[str] = self._control("POST", "_split", body)["children"]
        return children

    def _faults(self, method: str, body: dict[str, Any] | None) -> None:
        self._control(method, "_faults", body)

    def _control(self, method: str, route: str, body: dict[str, Any] | None) -> Any:
        if not self.emulated:
            raise RuntimeError(f"/{route} needs the local Cosmos DB server")
        import json
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.endpoint.rstrip('/')}/{route}", data=data, method=method
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def client(self) -> Any:
        """A new sync ``azure.cosmos.CosmosClient``; close it (or use ``with``)."""
        from azure.cosmos import CosmosClient

        return CosmosClient(self.endpoint, self.key, **self.client_kwargs)

    def async_client(self) -> Any:
        """A new ``azure.cosmos.aio.CosmosClient``; create it inside a running loop."""
        from azure.cosmos.aio import CosmosClient

        return CosmosClient(self.endpoint, self.key, **self.client_kwargs)


def cosmos_account_from_env() -> CosmosAccount | None:
    """The account of ``COSMOS_ENDPOINT``/``COSMOS_KEY`` (a real one or the official
    emulator), or None when they are not set."""
    endpoint = os.environ.get(COSMOS_ENDPOINT_ENV)
    key = os.environ.get(COSMOS_KEY_ENV)
    if not endpoint or not key:
        return None
    kwargs: dict[str, Any] = {}
    if endpoint.startswith(("https://localhost", "https://127.0.0.1")):
        kwargs["connection_verify"] = False  # the official emulator's certificate
    # Plain HTTP: the local server of `scripts/servers.sh start-cosmos` (Cosmos and the
    # official emulator speak only HTTPS).
    local = endpoint.startswith("http://")
    if local:
        kwargs["enable_endpoint_discovery"] = False
    return CosmosAccount(endpoint=endpoint, key=key, client_kwargs=kwargs, emulated=local)


class CosmosServer(ServerProcess):
    """The local Cosmos DB server (``@vercel/cosmosdb-server``, patched) in a node subprocess.

    Usage::

        with CosmosServer() as server:
            client = azure.cosmos.CosmosClient(server.endpoint, server.key,
                                               **server.client_kwargs)

    It listens on a free port over plain HTTP (``--no-ssl``). The SDK then needs
    ``enable_endpoint_discovery=False``: the server's account document advertises an
    ``https://`` address that the SDK would otherwise switch to. Plain HTTP rather than the
    server's self-signed HTTPS (which needs ``connection_verify=False``): the stock server
    closes the connection after every response, and a TLS handshake per request made 200
    upserts about 15x slower (6.2 s against 0.37 s), with an InsecureRequestWarning each.
    ``--keep-alive`` (added by the project's patch) keeps connections open: about 15%
    faster again. Data lives in
    memory and is lost when the server stops. The process exits when its stdin is closed,
    so it also dies with the Python process that started it.
    """

    title = "Cosmos DB server"

    def __init__(
        self,
        *,
        feed_ranges: int = DEFAULT_COSMOS_FEED_RANGES,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        if feed_ranges < 1:
            raise ValueError(f"feed_ranges must be at least 1, got {feed_ranges}")
        super().__init__(startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.feed_ranges = feed_ranges

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def key(self) -> str:
        return EMULATOR_KEY

    @property
    def client_kwargs(self) -> dict[str, Any]:
        return {"enable_endpoint_discovery": False}

    def account(self) -> CosmosAccount:
        return CosmosAccount(
            endpoint=self.endpoint,
            key=self.key,
            client_kwargs=self.client_kwargs,
            emulated=True,
        )

    def unavailable(self) -> str | None:
        return cosmos_server_available()

    def command(self) -> list[str]:
        node = shutil.which("node")
        assert node is not None
        return [
            node,
            "--require",
            str(COSMOS_WATCHDOG),
            str(COSMOS_CLI),
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--no-ssl",
            "--keep-alive",
        ]

    def environment(self) -> dict[str, str]:
        return {**os.environ, COSMOS_FEED_RANGES_ENV: str(self.feed_ranges)}

    def workdir(self) -> Path:
        return COSMOS_DIR

    def ready_port(self, line: str) -> int | None:
        match = _COSMOS_READY.search(line)
        return int(match.group(2)) if match else None

    def __repr__(self) -> str:
        state = f"port={self._port}" if self._port is not None else "stopped"
        return f"<CosmosServer {state} feed_ranges={self.feed_ranges}>"
