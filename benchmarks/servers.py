"""The repository's local servers, for the benchmarks and the tests alike.

- the MongoDB wire server (:mod:`docoutbox.testing.mongo_server`) over the jars of
  ``tests/servers/mongo/lib``, fetched by ``scripts/servers.sh install-mongo``;
- the Cosmos DB server, ``@vercel/cosmosdb-server`` with the project's patch (see
  ``tests/servers/cosmos``), installed by ``scripts/servers.sh install-cosmos``, or the
  account of ``COSMOS_ENDPOINT``/``COSMOS_KEY``;
- the Kafka broker of ``scripts/servers.sh start-kafka`` (single node, KRaft) on
  127.0.0.1:19092, or ``DOCOUTBOX_KAFKA_BOOTSTRAP``, and uniquely named topics on it.

Only the standard library is imported at module level; azure-cosmos and confluent-kafka
are optional and imported where they are used. Fidelity gaps of the servers versus the
real databases are listed in ``tests/README.md``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docoutbox.testing.mongo_server import MongoWireServer as _MongoWireServer
from docoutbox.testing.mongo_server import mongo_wire_server_available as _available
from docoutbox.testing.process import ServerProcess

REPO_ROOT: Path = Path(__file__).resolve().parents[1]
MONGO_LIB: Path = REPO_ROOT / "tests" / "servers" / "mongo" / "lib"


class MongoWireServer(_MongoWireServer):
    """:class:`docoutbox.testing.mongo_server.MongoWireServer` over the repository's jars."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("lib", MONGO_LIB)
        super().__init__(**options)


def mongo_wire_server_available() -> str | None:
    """Return None when the wire server can be launched, else a human-readable reason."""
    return _available(MONGO_LIB)


# --- Cosmos DB ---------------------------------------------------------------------------

COSMOS_DIR: Path = REPO_ROOT / "tests" / "servers" / "cosmos"
COSMOS_CLI: Path = COSMOS_DIR / "node_modules" / "@vercel" / "cosmosdb-server" / "lib" / "cli.js"
COSMOS_WATCHDOG: Path = COSMOS_DIR / "exit-on-stdin-eof.js"
#: Preloaded with ``tls=``: the server presents the certificate named by these variables.
COSMOS_TLS_PRELOAD: Path = COSMOS_DIR / "tls-from-env.js"
COSMOS_TLS_ENV = ("COSMOSDB_SERVER_TLS_CERT", "COSMOSDB_SERVER_TLS_KEY")
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
        tls: tuple[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``tls``: (certificate, private key) PEM files: serve HTTPS with them instead of
        plain HTTP. ``host``: the loopback address to listen on (azure-cosmos checks no
        certificate of a ``127.0.0.1`` or ``localhost`` endpoint unless told to)."""
        if feed_ranges < 1:
            raise ValueError(f"feed_ranges must be at least 1, got {feed_ranges}")
        super().__init__(startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.feed_ranges = feed_ranges
        self.tls = tls
        self.host = host

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/"

    @property
    def key(self) -> str:
        return EMULATOR_KEY

    @property
    def client_kwargs(self) -> dict[str, Any]:
        if self.tls:
            from azure.cosmos.documents import SSLConfiguration

            config = SSLConfiguration()
            config.SSLCaCerts = self.tls[0]
            return {"connection_verify": self.tls[0], "ssl_config": config}
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
        preload = ["--require", str(COSMOS_TLS_PRELOAD)] if self.tls else []
        return [
            node,
            "--require",
            str(COSMOS_WATCHDOG),
            *preload,
            str(COSMOS_CLI),
            "--port",
            "0",
            "--host",
            self.host,
            *([] if self.tls else ["--no-ssl"]),
            "--keep-alive",
        ]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, COSMOS_FEED_RANGES_ENV: str(self.feed_ranges)}
        if self.tls:
            env.update(zip(COSMOS_TLS_ENV, self.tls, strict=True))
        return env

    def workdir(self) -> Path:
        return COSMOS_DIR

    def ready_port(self, line: str) -> int | None:
        match = _COSMOS_READY.search(line)
        return int(match.group(2)) if match else None

    def __repr__(self) -> str:
        state = f"port={self._port}" if self._port is not None else "stopped"
        return f"<CosmosServer {state} feed_ranges={self.feed_ranges}>"


# --- Kafka ----------------------------------------------------------------------------------

DEFAULT_KAFKA_PORT = 19092
KAFKA_BOOTSTRAP_ENV = "DOCOUTBOX_KAFKA_BOOTSTRAP"


def kafka_port() -> int:
    return int(os.environ.get("DOCOUTBOX_KAFKA_PORT") or DEFAULT_KAFKA_PORT)


def kafka_bootstrap() -> str:
    """``$DOCOUTBOX_KAFKA_BOOTSTRAP`` or the broker of ``scripts/servers.sh start-kafka``."""
    return os.environ.get(KAFKA_BOOTSTRAP_ENV) or f"127.0.0.1:{kafka_port()}"


def kafka_available(bootstrap: str, timeout: float = 5.0) -> str | None:
    """Return None when the cluster answers a metadata request, else the reason."""
    try:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return "confluent-kafka is not installed"
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        return f"Kafka not reachable at {bootstrap}: {exc}"
    return None


class Topics:
    """Uniquely named topics on a real cluster, deleted by :meth:`close`."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.names: list[str] = []

    def create(self, prefix: str = "dx-topic", partitions: int = 1) -> str:
        from confluent_kafka.cimpl import NewTopic

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        for future in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)
        self.names.append(name)
        self._wait_for_leaders(name, partitions)
        return name

    def _wait_for_leaders(self, name: str, partitions: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            topic = self.admin.list_topics(name, timeout=10).topics.get(name)
            leaders = [] if topic is None else [p.leader for p in topic.partitions.values()]
            if len(leaders) == partitions and min(leaders) >= 0:
                return
            assert time.monotonic() < deadline, f"topic {name} has no leaders"
            time.sleep(0.05)

    def read(self, topic: str, count: int, timeout: float = 15.0) -> list[Any]:
        """The first ``count`` records of ``topic`` (every partition, from the start)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"dx-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
            records: list[Any] = []
            deadline = time.monotonic() + timeout
            while len(records) < count and time.monotonic() < deadline:
                record = consumer.poll(0.2)
                if record is not None and record.error() is None:
                    records.append(record)
            return records
        finally:
            consumer.close()

    def size(self, topic: str) -> int:
        """How many records ``topic`` holds (the sum of its partitions' high watermarks)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "dx-size"})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            return sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in meta.partitions
            )
        finally:
            consumer.close()

    def committed(self, topic: str, group: str) -> dict[int, int]:
        """The group's committed offset per partition (-1001 when none)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            parts = consumer.committed(
                [TopicPartition(topic, p) for p in meta.partitions], timeout=10
            )
            return {tp.partition: tp.offset for tp in parts}
        finally:
            consumer.close()

    def committed_total(self, topic: str, group: str) -> int:
        """How many records of ``topic`` the group has committed past, over all partitions."""
        return sum(max(offset, 0) for offset in self.committed(topic, group).values())

    def close(self) -> None:
        if self.names:
            for future in self.admin.delete_topics(self.names).values():
                future.result(timeout=30)
            self.names = []
