"""The asyncio side of the Cosmos DB dispatcher ports, on ``azure.cosmos.aio``.

Thin shells: what a request carries and what an answer means come from the same
functions as the sync ports (:func:`~docoutbox_cosmos.changes.opened_tokens`,
:func:`~docoutbox_cosmos.changes.page_events`,
:func:`~docoutbox_cosmos.coordination.checkpoint_item`,
:func:`~docoutbox_cosmos.coordination.dead_letter_item`); only the ``await`` differs.

The lease table stays sync (:class:`~docoutbox_cosmos.coordination.CosmosLeaseTable`), on a
client of its own: the lease keeper heartbeats on its own thread, whatever the event loop
is doing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azure.cosmos import PartitionKey
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.dispatch.ports import ChangeEvent, Position
from docoutbox.errors import ChangeStreamLost, PermanentStoreError
from docoutbox.model import AggregateId
from docoutbox_cosmos.backend import AsyncCosmosBackend, ChargeHook
from docoutbox_cosmos.changes import _LastHeaders, opened_tokens, page_events, range_key
from docoutbox_cosmos.coordination import (
    CosmosLeaseTable,
    checkpoint_item,
    dead_letter_item,
)
from docoutbox_cosmos.errors import Refusal, refusal, translated, translated_feed
from docoutbox_cosmos.items import ItemCodec, encode_id


class AsyncCosmosChangeSource:
    """The async twin of :class:`~docoutbox_cosmos.changes.CosmosChangeSource` (same
    positions, so either can resume the other's checkpoint)."""

    def __init__(
        self,
        container: Any,
        *,
        codec: ItemCodec | None = None,
        feed_ranges: list[dict[str, Any]] | None = None,
    ) -> None:
        self.container = container
        self.codec = codec or ItemCodec()
        self._ranges = feed_ranges
        self._tokens: dict[str, str] | None = None
        self._next = 0

    async def feed_ranges(self) -> dict[str, dict[str, Any]]:
        if self._ranges is None:
            with translated():
                ranges = [r async for r in self.container.read_feed_ranges()]
        else:
            ranges = self._ranges
        return {range_key(r): r for r in ranges}

    async def start_marker(self) -> Position:
        tokens: dict[str, str] = {}
        for key, feed_range in (await self.feed_ranges()).items():
            hook = _LastHeaders()
            with translated_feed():
                pager = self.container.query_items_change_feed(
                    feed_range=feed_range, start_time="Now", response_hook=hook
                )
                async for _ in pager.by_page():
                    break  # "Now" has nothing yet; a page here only moves the start later
            tokens[key] = hook.continuation()
        return {"v": 1, "ranges": tokens}

    async def open(self, position: Position) -> None:
        self._tokens = opened_tokens(position, await self.feed_ranges())
        self._next = 0

    def _position(self) -> Position:
        assert self._tokens is not None
        return {"v": 1, "ranges": dict(self._tokens)}

    async def poll(self, max_events: int) -> list[ChangeEvent]:
        if self._tokens is None:
            raise ChangeStreamLost("the change feed is not open")
        events: list[ChangeEvent] = []
        keys = sorted(self._tokens)
        for step in range(len(keys)):
            if len(events) >= max_events:
                break
            key = keys[(self._next + step) % len(keys)]
            events.extend(await self._read_page(key, max_events - len(events)))
        self._next = (self._next + 1) % len(keys)
        return events

    async def _read_page(self, key: str, limit: int) -> list[ChangeEvent]:
        assert self._tokens is not None
        hook = _LastHeaders()
        before = self._position()
        with translated_feed():
            try:
                pager = self.container.query_items_change_feed(
                    continuation=self._tokens[key], max_item_count=limit, response_hook=hook
                )
                items: list[dict[str, Any]] = []
                async for page in pager.by_page():
                    items = [item async for item in page]
                    break
            except (ValueError, KeyError, TypeError) as exc:  # the SDK parses the token
                raise ChangeStreamLost(f"unusable change feed continuation: {exc!r}") from exc
        self._tokens[key] = hook.continuation()
        return page_events(self.codec, before, self._position(), items)

    async def close(self) -> None:
        self._tokens = None


class AsyncCosmosCheckpoints:
    """The async twin of :class:`~docoutbox_cosmos.coordination.CosmosCheckpoints`."""

    def __init__(self, container: Any) -> None:
        self.container = container

    async def load(self, name: str) -> Position | None:
        item_id = encode_id(name)
        with translated():
            try:
                item = await self.container.read_item(item_id, partition_key=item_id)
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.MISSING:
                    raise
                return None
        return item.get("position")

    async def save(self, name: str, position: Position) -> None:
        with translated():
            await self.container.upsert_item(checkpoint_item(name, position))


class AsyncCosmosDeadLetters:
    """The async twin of :class:`~docoutbox_cosmos.coordination.CosmosDeadLetters`."""

    def __init__(self, container: Any) -> None:
        self.container = container

    async def put(
        self, aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
    ) -> None:
        body = dead_letter_item(aggregate_id, entry, error, attempts)
        with translated(aggregate_id):
            try:
                await self.container.create_item(body)
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.EXISTS:
                    raise  # a 409 means already quarantined


@dataclass
class AsyncCosmosDispatchTarget:
    """What an :class:`~docoutbox.dispatch.aio.AsyncDispatcher` needs from one account."""

    client: Any
    lease_client: Any
    backend: AsyncCosmosBackend
    source: AsyncCosmosChangeSource
    checkpoints: AsyncCosmosCheckpoints
    leases: CosmosLeaseTable
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
    timeout: float = 5.0,
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
        with translated():
            db = client.get_database_client(database)
            coll = db.get_container_client(container)
            await coll.read()
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
            leases=CosmosLeaseTable(sync_coordination(lease_db, leases), group or container),
            dead_letters=AsyncCosmosDeadLetters(await coordination_container(db, dead_letters)),
        )
    except BaseException:
        if lease_client is not None:
            lease_client.close()
        await client.close()
        raise
