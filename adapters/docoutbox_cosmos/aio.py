"""The asyncio dispatcher's connection to Cosmos DB, on ``azure.cosmos.aio``.

The async ports themselves (:class:`~docoutbox_cosmos.changes.AsyncCosmosChangeSource`,
:class:`~docoutbox_cosmos.coordination.AsyncCosmosCheckpoints`,
:class:`~docoutbox_cosmos.coordination.AsyncCosmosDeadLetters`) share their requests and
answers with the sync ones; only the ``await`` differs.

The lease table stays sync (:class:`~docoutbox_cosmos.leases.CosmosFeedRangeLeases`), on a
client of its own: the lease keeper heartbeats on its own thread, whatever the event loop
is doing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azure.cosmos import PartitionKey
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.errors import PermanentStoreError
from docoutbox_cosmos.backend import AsyncCosmosBackend, ChargeHook
from docoutbox_cosmos.changes import AsyncCosmosChangeSource
from docoutbox_cosmos.coordination import (
    AsyncCosmosCheckpoints,
    AsyncCosmosDeadLetters,
)
from docoutbox_cosmos.errors import Refusal, refusal, translated
from docoutbox_cosmos.existence import require_container_async
from docoutbox_cosmos.leases import CosmosFeedRangeLeases


@dataclass
class AsyncCosmosDispatchTarget:
    """What an :class:`~docoutbox.dispatch.drivers.aio.AsyncDispatcher` needs from one account."""

    client: Any
    lease_client: Any
    backend: AsyncCosmosBackend
    source: AsyncCosmosChangeSource
    checkpoints: AsyncCosmosCheckpoints
    leases: CosmosFeedRangeLeases
    dead_letters: AsyncCosmosDeadLetters

    async def close(self) -> None:
        await self.client.close()
        self.lease_client.close()


def _transport() -> Any:
    """An aiohttp transport that accepts the SDK's empty client certificate.

    With an ``ssl_config`` (how a CA file is given), ``azure.cosmos.aio`` sends every
    request with ``connection_cert=(None, None)``, which azure-core's aiohttp transport
    loads as a certificate chain and fails on; the sync transport ignores it. This drops
    that empty pair, nothing else.
    """
    from azure.core.pipeline.transport import AioHttpTransport

    class Transport(AioHttpTransport):  # type: ignore[misc]
        async def send(self, request: Any, **config: Any) -> Any:
            cert = config.get("connection_cert")
            if isinstance(cert, tuple) and not any(cert):
                del config["connection_cert"]
            return await super().send(request, **config)

    return Transport()


def open_async_client(endpoint: str, key: str, **options: Any) -> Any:
    """An ``azure.cosmos.aio.CosmosClient``, with the same options as
    :func:`~docoutbox_cosmos.wiring.open_client` (the CA file of
    :func:`~docoutbox_cosmos.wiring.tls_options` included)."""
    from azure.cosmos.aio import CosmosClient

    if endpoint.startswith("http://"):
        options.setdefault("enable_endpoint_discovery", False)
    if options.get("ssl_config") is not None and "transport" not in options:
        options["transport"] = _transport()
    try:
        with translated():
            return CosmosClient(endpoint, key, **options)
    except (ValueError, TypeError) as exc:  # a malformed endpoint or key, found locally
        raise PermanentStoreError(f"invalid Cosmos DB endpoint or key: {exc}") from exc


async def coordination_container(database: Any, name: str) -> Any:
    """The async twin of :func:`~docoutbox_cosmos.wiring.coordination_container`."""
    with translated():
        try:
            return await database.create_container_if_not_exists(name, PartitionKey(path="/id"))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is not Refusal.EXISTS:
                raise
            return database.get_container_client(name)


async def connect_dispatch_async(
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
) -> AsyncCosmosDispatchTarget:
    """Like :func:`~docoutbox_cosmos.wiring.connect_dispatch`, on ``azure.cosmos.aio``
    (the lease table on a sync client of its own)."""
    from docoutbox_cosmos.wiring import base_options, open_client
    from docoutbox_cosmos.wiring import coordination_container as sync_coordination

    options = {**base_options(timeout), **(client_options or {})}
    client = open_async_client(endpoint, key, **options)
    lease_client: Any = None
    try:
        lease_client = open_client(endpoint, key, **options)
        db = client.get_database_client(database)
        coll = db.get_container_client(container)
        await require_container_async(coll)
        backend = AsyncCosmosBackend(
            coll, partition_key_path=partition_key_path, on_charge=on_charge
        )
        lease_db = lease_client.get_database_client(database)
        return AsyncCosmosDispatchTarget(
            client=client,
            lease_client=lease_client,
            backend=backend,
            source=AsyncCosmosChangeSource(coll, codec=backend.codec),
            checkpoints=AsyncCosmosCheckpoints(await coordination_container(db, checkpoints)),
            leases=CosmosFeedRangeLeases(
                sync_coordination(lease_db, leases),
                lease_db.get_container_client(container),
                group or container,
                codec=backend.codec,
            ),
            dead_letters=AsyncCosmosDeadLetters(await coordination_container(db, dead_letters)),
        )
    except BaseException:
        if lease_client is not None:
            lease_client.close()
        await client.close()
        raise
