"""Cosmos DB clients, sync and aio, with the options every docoutbox client shares, and
the coordination containers (checkpoints, leases, dead letters), created when missing."""

from __future__ import annotations

from typing import Any

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.cosmos import CosmosClient, PartitionKey
from azure.cosmos import exceptions as cosmos_errors
from azure.cosmos.documents import SSLConfiguration
from urllib3.util.retry import Retry

from docoutbox.errors import PermanentStoreError
from docoutbox_cosmos.coordination import RENEW_CONCURRENCY
from docoutbox_cosmos.errors import Refusal, refusal, translated


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


def _transport() -> Any:
    """An aiohttp transport that accepts the SDK's empty client certificate.

    With an ``ssl_config`` (how a CA file is given), ``azure.cosmos.aio`` sends every
    request with ``connection_cert=(None, None)``, which azure-core's aiohttp transport
    loads as a certificate chain and fails on; the sync transport ignores it. This drops
    that empty pair, nothing else.
    """
    from azure.core.pipeline.transport import AioHttpTransport  # noqa: PLC0415 - aiohttp, aio only

    class Transport(AioHttpTransport):  # type: ignore[misc]
        async def send(self, request: Any, **config: Any) -> Any:
            cert = config.get("connection_cert")
            if isinstance(cert, tuple) and not any(cert):
                del config["connection_cert"]
            return await super().send(request, **config)

    return Transport()


def open_async_client(endpoint: str, key: str, **options: Any) -> Any:
    """An ``azure.cosmos.aio.CosmosClient``, with the same options as
    :func:`open_client` (the CA file of
    :func:`tls_options` included)."""
    from azure.cosmos.aio import CosmosClient  # noqa: PLC0415 - aiohttp, aio only

    if endpoint.startswith("http://"):
        options.setdefault("enable_endpoint_discovery", False)
    if options.get("ssl_config") is not None and "transport" not in options:
        options["transport"] = _transport()
    try:
        with translated():
            return CosmosClient(endpoint, key, **options)
    except (ValueError, TypeError) as exc:  # a malformed endpoint or key, found locally
        raise PermanentStoreError(f"invalid Cosmos DB endpoint or key: {exc}") from exc


async def async_coordination_container(database: Any, name: str) -> Any:
    """The async twin of :func:`coordination_container`."""
    with translated():
        try:
            return await database.create_container_if_not_exists(name, PartitionKey(path="/id"))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is not Refusal.EXISTS:
                raise
            return database.get_container_client(name)
