"""Connect everything a dispatcher needs from one Cosmos DB account (used by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azure.cosmos import CosmosClient, PartitionKey
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.errors import PermanentStoreError
from docoutbox_cosmos.backend import ChargeHook, CosmosBackend
from docoutbox_cosmos.changes import CosmosChangeSource
from docoutbox_cosmos.coordination import RENEW_CONCURRENCY, CosmosCheckpoints, CosmosDeadLetters
from docoutbox_cosmos.errors import Refusal, refusal, translated
from docoutbox_cosmos.existence import require_container
from docoutbox_cosmos.leases import CosmosFeedRangeLeases, LeasedChangeSource


@dataclass
class CosmosDispatchTarget:
    """What a dispatcher uses. ``source`` and ``checkpoints`` serve a single instance
    (every feed range, one checkpoint item); :meth:`leased` switches them to the feed-range
    leases of ``leases`` for instances that share the container."""

    client: Any
    backend: CosmosBackend
    source: CosmosChangeSource
    checkpoints: CosmosCheckpoints | CosmosFeedRangeLeases
    leases: CosmosFeedRangeLeases
    dead_letters: CosmosDeadLetters

    def leased(self) -> None:
        """Read only the feed ranges whose leases are held, checkpointed in the leases."""
        self.source = LeasedChangeSource(self.source.container, self.leases)
        self.checkpoints = self.leases

    @property
    def is_leased(self) -> bool:
        """Whether ``source`` and ``checkpoints`` follow the held leases (:meth:`leased`)."""
        return isinstance(self.source, LeasedChangeSource)

    def close(self) -> None:
        self.client.close()


def open_client(endpoint: str, key: str, **options: Any) -> Any:
    """A sync ``CosmosClient``. A plain ``http://`` endpoint (a local emulator) is used as
    is: endpoint discovery would switch to the ``https://`` address the account advertises.
    """
    if endpoint.startswith("http://"):
        options.setdefault("enable_endpoint_discovery", False)
    try:
        with translated():
            return CosmosClient(endpoint, key, **options)
    except (ValueError, TypeError) as exc:  # a malformed endpoint or key, found locally
        raise PermanentStoreError(f"invalid Cosmos DB endpoint or key: {exc}") from exc


#: The most connections a client's pool keeps per host.
MAX_POOL = 4096


def pool_size(concurrency: int) -> int:
    """Connections a threaded dispatcher of ``concurrency`` may use at once against one
    account: its publishing workers and as many trim workers, the lease renewals, and a
    few for the stream, sweeps, checkpoints and backlog measurements."""
    return min(MAX_POOL, 2 * concurrency + RENEW_CONCURRENCY + 8)


def pooled_transport(size: int) -> Any:
    """A ``requests`` transport for the sync client whose connection pool keeps ``size``
    connections per host. The SDK's default keeps 10: more threads than that made urllib3
    discard connections ("Connection pool is full") and open new ones. No retries at this
    level, as the SDK's own transport (the SDK retries)."""
    import requests
    from azure.core.pipeline.transport import RequestsTransport
    from urllib3.util.retry import Retry

    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(
        pool_maxsize=size, max_retries=Retry(total=False, redirect=False, raise_on_status=False)
    )
    for prefix in ("http://", "https://"):
        session.mount(prefix, adapter)
    return RequestsTransport(session=session, session_owner=True)


def base_options(timeout: float | None) -> dict[str, Any]:
    """Client options of the dispatcher: fail fast on an unreachable account (within
    ``timeout`` seconds; None: 5)."""
    seconds = 5.0 if timeout is None else timeout
    return {"connection_timeout": max(1, int(seconds)), "retry_total": 1}


def tls_options(ca_file: str | None = None, insecure: bool = False) -> dict[str, Any]:
    """Client options for an ``https://`` endpoint whose certificate is not signed by a
    public authority (the official emulator, a private CA): trust the PEM certificates of
    ``ca_file``, or, with ``insecure``, do not check the certificate at all (anyone on the
    path could then read the traffic). Both the sync and the aio client take them.

    The CA file goes in an ``ssl_config`` as well as ``connection_verify``: azure-cosmos
    ignores a ``connection_verify`` path otherwise, and, for ``localhost``/``127.0.0.1``
    endpoints, checks no certificate at all unless an ``ssl_config`` is given.

    Raises :class:`~docoutbox.errors.PermanentStoreError` for both at once or an unreadable
    file.
    """
    if ca_file and insecure:
        raise PermanentStoreError("give either a CA file or insecure, not both")
    if insecure:
        return {"connection_verify": False}
    if not ca_file:
        return {}
    try:
        with open(ca_file, "rb") as pem:
            head = pem.read(4096)
    except OSError as exc:
        raise PermanentStoreError(f"cannot read the CA file {ca_file!r}: {exc}") from exc
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise PermanentStoreError(f"the CA file {ca_file!r} holds no PEM certificate")
    from azure.cosmos.documents import SSLConfiguration

    config = SSLConfiguration()
    config.SSLCaCerts = ca_file
    return {"connection_verify": ca_file, "ssl_config": config}


def coordination_container(database: Any, name: str) -> Any:
    """The container ``name`` (partitioned on ``/id``), created when missing.

    Instances starting together race to create it: the loser's 409 means it exists now.
    """
    with translated():
        try:
            return database.create_container_if_not_exists(name, PartitionKey(path="/id"))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is not Refusal.EXISTS:
                raise
            return database.get_container_client(name)


def connect_dispatch(
    endpoint: str,
    key: str,
    database: str,
    container: str,
    *,
    timeout: float | None = None,
    checkpoints: str = "docoutbox_checkpoints",
    leases: str = "docoutbox_leases",
    dead_letters: str = "docoutbox_dead_letters",
    group: str | None = None,
    partition_key_path: str = "/id",
    on_charge: ChargeHook | None = None,
    client_options: dict[str, Any] | None = None,
) -> CosmosDispatchTarget:
    """Open a client, check the aggregates' container exists, and create the
    coordination containers when missing.

    Raises :class:`~docoutbox.errors.StoreError` for a bad endpoint or key, an unreachable
    account, or a missing database or container.
    """
    client = open_client(endpoint, key, **{**base_options(timeout), **(client_options or {})})
    try:
        db = client.get_database_client(database)
        coll = db.get_container_client(container)
        require_container(coll)
        backend = CosmosBackend(coll, partition_key_path=partition_key_path, on_charge=on_charge)
        lease_table = CosmosFeedRangeLeases(
            coordination_container(db, leases), coll, group or container, codec=backend.codec
        )
        return CosmosDispatchTarget(
            client=client,
            backend=backend,
            source=CosmosChangeSource(coll, codec=backend.codec),
            checkpoints=CosmosCheckpoints(coordination_container(db, checkpoints)),
            leases=lease_table,
            dead_letters=CosmosDeadLetters(coordination_container(db, dead_letters)),
        )
    except BaseException:
        client.close()
        raise


def cli_tls_options(args: Any) -> dict[str, Any]:
    """:func:`tls_options` from ``--cosmos-ca-file`` / ``--cosmos-insecure``, if given."""
    insecure = bool(getattr(args, "cosmos_insecure", False))
    options = tls_options(getattr(args, "cosmos_ca_file", None), insecure)
    if insecure:
        import warnings

        from urllib3.exceptions import InsecureRequestWarning

        # Said once, loudly, by the command; not once per request.
        warnings.filterwarnings("ignore", category=InsecureRequestWarning)
    return options


def connect_cli(args: Any) -> CosmosDispatchTarget:
    """:func:`connect_dispatch` from the ``docoutbox dispatch`` arguments, its connection
    pool sized for ``--concurrency`` (:func:`pool_size`)."""
    options = cli_tls_options(args)
    options["transport"] = pooled_transport(pool_size(args.concurrency))
    return connect_dispatch(
        args.cosmos_endpoint,
        args.cosmos_key,
        args.db,
        args.collection,
        timeout=args.server_timeout,
        client_options=options,
    )


async def connect_cli_async(args: Any) -> Any:
    """:func:`~docoutbox_cosmos.aio.connect_dispatch_async` from the same arguments."""
    from docoutbox_cosmos.aio import connect_dispatch_async

    return await connect_dispatch_async(
        args.cosmos_endpoint,
        args.cosmos_key,
        args.db,
        args.collection,
        timeout=args.server_timeout,
        client_options=cli_tls_options(args),
    )
