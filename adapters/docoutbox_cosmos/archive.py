"""The inbox archive on Cosmos DB: a side container ``<container>.inbox``.

Rule: one item per archived ID, in the logical partition of its aggregate (partition key
path ``/pk``, value the aggregate item's own partition-key value), ``id`` the SHA-256 of
the message ID (a message ID may hold characters an item ID may not, and be longer),
with ``aggregate_id`` and ``message_id`` as fields for readers such as the audit. Archiving
upserts (idempotent), in transactional batches of up to 100 (one logical partition, so one
request per 100 IDs); a lookup is one point read, or one query in the partition for
several IDs.

Consistency: under session consistency another process's read may miss a write it
has no session token for. Archiving returns the session token of its last upsert (all
of a spill's IDs are in one logical partition, so the last token covers the others); the
store records it on the aggregate document (``inbox_spill.token``) in the commit that
removes the IDs, and every lookup passes it on (``session_token``), so a process that
read the document reads the archive at least as new as the spill. With strong or
bounded-staleness consistency the token is harmless.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

from azure.cosmos import PartitionKey
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.model import AggregateId
from docoutbox_cosmos.errors import Refusal, refusal, translated

SUFFIX = ".inbox"
PARTITION_KEY_PATH = "/pk"
SESSION_HEADER = "x-ms-session-token"
#: Past this many IDs a lookup is a query instead of point reads.
POINT_READS = 1
#: The most operations of one transactional batch (a Cosmos DB limit).
MAX_BATCH = 100


def archive_name(container: str) -> str:
    """The archive container of the aggregate container ``container``."""
    return f"{container}{SUFFIX}"


def item_id(message_id: str) -> str:
    return hashlib.sha256(message_id.encode()).hexdigest()


def archive_item(aggregate_id: AggregateId, pk: str, message_id: str) -> dict[str, Any]:
    return {
        "id": item_id(message_id),
        "pk": pk,
        "aggregate_id": aggregate_id,
        "message_id": message_id,
        "archived_at": datetime.now(UTC).isoformat(),
    }


def lookup_query(pk: str, ids: Collection[str]) -> tuple[str, list[dict[str, Any]]]:
    sql = "SELECT c.message_id FROM c WHERE c.pk = @pk AND ARRAY_CONTAINS(@ids, c.message_id)"
    return sql, [{"name": "@pk", "value": pk}, {"name": "@ids", "value": list(ids)}]


class _Session:
    """Keeps the session token of the last response it hooked."""

    def __init__(self) -> None:
        self.token: str | None = None

    def headers(self, headers: Any, body: Any = None) -> None:
        """A ``response_hook``: keeps the response's session token."""
        token = headers.get(SESSION_HEADER) if headers is not None else None
        if token:
            self.token = str(token)


def batches(
    aggregate_id: AggregateId, pk: str, ids: Collection[str]
) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """The upserts of ``ids`` as transactional batches of at most :data:`MAX_BATCH`."""
    items = [("upsert", (archive_item(aggregate_id, pk, i),)) for i in dict.fromkeys(ids)]
    return [items[n : n + MAX_BATCH] for n in range(0, len(items), MAX_BATCH)]


def _session_kwargs(token: str | None) -> dict[str, Any]:
    return {} if token is None else {"session_token": token}


def ensure_archive(database: Any, name: str) -> Any:
    """The archive container ``name`` (partitioned on ``/pk``), created when missing."""
    with translated():
        try:
            return database.create_container_if_not_exists(
                name, PartitionKey(path=PARTITION_KEY_PATH)
            )
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is not Refusal.EXISTS:
                raise
            return database.get_container_client(name)


async def ensure_archive_async(database: Any, name: str) -> Any:
    """The async twin of :func:`ensure_archive`."""
    with translated():
        try:
            return await database.create_container_if_not_exists(
                name, PartitionKey(path=PARTITION_KEY_PATH)
            )
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is not Refusal.EXISTS:
                raise
            return database.get_container_client(name)


class CosmosInboxArchive:
    """Archive and look up spilled inbox IDs in an ``azure.cosmos`` container."""

    def __init__(self, container: Any, partition_key: Callable[[AggregateId], str]) -> None:
        self.container = container
        self._pk = partition_key

    def archive(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        pk = self._pk(aggregate_id)
        session = _Session()
        with translated(aggregate_id):
            for batch in batches(aggregate_id, pk, ids):
                self.container.execute_item_batch(batch, pk, response_hook=session.headers)
        return session.token

    def archived(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None
    ) -> set[str]:
        pk = self._pk(aggregate_id)
        wanted = list(dict.fromkeys(ids))
        with translated(aggregate_id):
            if len(wanted) <= POINT_READS:
                return {i for i in wanted if self._read(pk, i, token)}
            sql, parameters = lookup_query(pk, wanted)
            rows = self.container.query_items(
                sql, parameters=parameters, partition_key=pk, **_session_kwargs(token)
            )
            return {row["message_id"] for row in rows} & set(wanted)

    def _read(self, pk: str, message_id: str, token: str | None) -> bool:
        try:
            item = self.container.read_item(item_id(message_id), pk, **_session_kwargs(token))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is Refusal.MISSING:
                return False
            raise
        return bool(item.get("message_id") == message_id)


class AsyncCosmosInboxArchive:
    """The ``azure.cosmos.aio`` twin of :class:`CosmosInboxArchive`."""

    def __init__(self, container: Any, partition_key: Callable[[AggregateId], str]) -> None:
        self.container = container
        self._pk = partition_key

    async def archive(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        pk = self._pk(aggregate_id)
        session = _Session()
        with translated(aggregate_id):
            for batch in batches(aggregate_id, pk, ids):
                await self.container.execute_item_batch(batch, pk, response_hook=session.headers)
        return session.token

    async def archived(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None
    ) -> set[str]:
        pk = self._pk(aggregate_id)
        wanted = list(dict.fromkeys(ids))
        with translated(aggregate_id):
            if len(wanted) <= POINT_READS:
                return {i for i in wanted if await self._read(pk, i, token)}
            sql, parameters = lookup_query(pk, wanted)
            rows = self.container.query_items(
                sql, parameters=parameters, partition_key=pk, **_session_kwargs(token)
            )
            return {row["message_id"] async for row in rows} & set(wanted)

    async def _read(self, pk: str, message_id: str, token: str | None) -> bool:
        try:
            item = await self.container.read_item(item_id(message_id), pk, **_session_kwargs(token))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is Refusal.MISSING:
                return False
            raise
        return bool(item.get("message_id") == message_id)
