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
from functools import cached_property
from typing import Any

from docoutbox_cosmos.archive import ensure_archive_async
from docoutbox_cosmos.backend import AsyncCosmosBackend, ChargeHook
from docoutbox_cosmos.changes import AsyncCosmosChangeSource
from docoutbox_cosmos.clients import (
    async_coordination_container,
    base_options,
    coordination_container,
    open_async_client,
    open_client,
)
from docoutbox_cosmos.coordination import (
    AsyncCosmosCheckpoints,
    AsyncCosmosDeadLetters,
)
from docoutbox_cosmos.existence import require_container_async
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from docoutbox_cosmos.payloads import (
    AsyncCosmosPayloads,
    create_payloads_container,
    payloads_container,
)


@dataclass
class AsyncCosmosKit:
    """An :class:`~docoutbox.ports.kit.AsyncStoreKit` on one container."""

    client: Any
    lease_client: Any
    backend: AsyncCosmosBackend
    source: AsyncCosmosChangeSource
    checkpoints: AsyncCosmosCheckpoints
    leases: CosmosFeedRangeLeases
    dead_letters: AsyncCosmosDeadLetters

    @cached_property
    def payloads(self) -> AsyncCosmosPayloads:
        """The async twin of :attr:`~docoutbox_cosmos.kit.CosmosKit.payloads` (the
        container is created, when missing, through the sync lease client)."""
        coll = self.backend.container
        name = payloads_container(coll.id)
        database = coll.container_link.split("/")[1]
        create_payloads_container(self.lease_client.get_database_client(database), name)
        return AsyncCosmosPayloads(
            self.client.get_database_client(database).get_container_client(name)
        )

    async def close(self) -> None:
        self.leases.close()
        await self.client.close()
        self.lease_client.close()


async def open_async_kit(
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
    inbox_archive: str | None = None,
) -> AsyncCosmosKit:
    """Like :func:`~docoutbox_cosmos.kit.open_kit`, on ``azure.cosmos.aio`` (the lease
    table on a sync client of its own)."""

    options = {**base_options(timeout), **(client_options or {})}
    client = open_async_client(endpoint, key, **options)
    lease_client: Any = None
    try:
        lease_client = open_client(endpoint, key, **options)
        db = client.get_database_client(database)
        coll = db.get_container_client(container)
        await require_container_async(coll)
        archive = None
        if inbox_archive is not None:
            archive = await ensure_archive_async(db, inbox_archive)
        backend = AsyncCosmosBackend(
            coll, partition_key_path=partition_key_path, on_charge=on_charge, inbox_archive=archive
        )
        lease_db = lease_client.get_database_client(database)
        return AsyncCosmosKit(
            client=client,
            lease_client=lease_client,
            backend=backend,
            source=AsyncCosmosChangeSource(coll, codec=backend.codec),
            checkpoints=AsyncCosmosCheckpoints(await async_coordination_container(db, checkpoints)),
            leases=CosmosFeedRangeLeases(
                coordination_container(lease_db, leases),
                lease_db.get_container_client(container),
                group or container,
                codec=backend.codec,
            ),
            dead_letters=AsyncCosmosDeadLetters(
                await async_coordination_container(db, dead_letters)
            ),
        )
    except BaseException:
        if lease_client is not None:
            lease_client.close()
        await client.close()
        raise
