"""The claim check's payload store on Cosmos DB: a side container, one logical partition
per payload.

Items are limited to 2 MB, so a payload is split (:mod:`docoutbox.stored.chunks` keeps
the rules) across items of its own logical partition (partition key ``/pid`` = the
payload ID)::

    {id: "manifest", pid, kind: "manifest", payload_id, aggregate_id, entry_id, size,
     stored_at, generation, count, finished}
    {id: "<payload ID>.<generation>.<n>", pid, kind: "chunk", g, n, t, data: <base64>}

A chunk holds at most :data:`CHUNK_SIZE` bytes (base64 in the item: about 1.4 MB, under
the 2 MB limit and under the local test server's request size). Both twins build their
items and queries with the functions below and only call the SDK; a delete (all of a
payload, or a stale put's, guarded by its manifest's ETag) is decided by one sans-IO
flow (:func:`delete_flow`, :func:`delete_stale_flow`) each twin drives.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import PartitionKey
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.drive import drive, drive_async
from docoutbox.errors import TransientStoreError
from docoutbox.ports.payloads import PayloadInfo
from docoutbox.stored.chunks import assemble, chunk_name, info_of, manifest, split
from docoutbox_cosmos.errors import Refusal, refusal, translated
from docoutbox_cosmos.items import format_time, parse_time, to_json

#: Bytes per chunk item.
CHUNK_SIZE = 1024 * 1024
MANIFEST = "manifest"
_CHUNKS = "SELECT * FROM c WHERE c.pid = @pid AND c.kind = 'chunk'"
_STALE = "SELECT * FROM c WHERE c.kind = 'manifest' AND c.stored_at < @before"


def payloads_container(container: str) -> str:
    """The side container holding the payloads of ``container``'s entries."""
    return f"{container}_payloads"


def create_payloads_container(database: Any, name: str) -> Any:
    """The payload container ``name`` (partitioned on ``/pid``), created when missing."""
    with translated():
        try:
            return database.create_container_if_not_exists(name, PartitionKey(path="/pid"))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if refusal(exc) is not Refusal.EXISTS:
                raise
            return database.get_container_client(name)


def _head(info: PayloadInfo, count: int, finished: bool) -> dict[str, Any]:
    fields = manifest(info, count, finished)
    fields["stored_at"] = format_time(info.stored_at)
    return {"id": MANIFEST, "pid": info.payload_id, "kind": MANIFEST, **to_json(fields)}  # type: ignore[dict-item]


def _chunks(info: PayloadInfo, data: bytes, size: int) -> list[dict[str, Any]]:
    return [
        {
            "id": chunk_name(info.payload_id, info.generation, number),
            "pid": info.payload_id,
            "kind": "chunk",
            "g": info.generation,
            "n": number,
            "t": format_time(info.stored_at),
            "data": base64.b64encode(part).decode("ascii"),
        }
        for number, part in enumerate(split(data, size))
    ]


def _query(payload_id: str) -> dict[str, Any]:
    return {
        "query": _CHUNKS,
        "parameters": [{"name": "@pid", "value": payload_id}],
        "partition_key": payload_id,
    }


def _assembled(head: dict[str, Any] | None, chunks: list[dict[str, Any]]) -> bytes:
    if head is None:
        return assemble(None, ())
    parts = [
        (int(c["n"]), base64.b64decode(c["data"]))
        for c in chunks
        if c.get("g") == head["generation"]
    ]
    return assemble(head, parts)


def _info(head: dict[str, Any]) -> PayloadInfo:
    return info_of(head, parse_time(head["stored_at"]))


def _same_put(head: dict[str, Any] | None, info: PayloadInfo) -> bool:
    return (
        head is not None
        and head.get("generation") == info.generation
        and parse_time(head.get("stored_at")) == parse_time(format_time(info.stored_at))
    )


def _replaced(chunk: dict[str, Any], info: PayloadInfo) -> bool:
    """Whether ``chunk`` belongs to ``info``'s put or to one before it."""
    return chunk.get("g") == info.generation or str(chunk.get("t")) < format_time(info.stored_at)


def _unfinished(head: dict[str, Any] | None, info: PayloadInfo) -> TransientStoreError | None:
    if head is not None and head.get("finished"):
        return None
    return TransientStoreError(
        f"payload {info.payload_id}: another put replaced this one and did not finish"
    )


def _missing(exc: cosmos_errors.CosmosHttpResponseError) -> bool:
    return refusal(exc) is Refusal.MISSING


@dataclass(frozen=True)
class ReadHead:
    """Read a payload's manifest (None when there is none)."""

    payload_id: str


@dataclass(frozen=True)
class ChunkItems:
    """List a payload's chunk items, every generation's."""

    payload_id: str


@dataclass(frozen=True)
class DeleteItem:
    """Delete one item of a payload's partition: True if deleted, False if it was gone
    (or, with ``etag``, changed since that read)."""

    item_id: str
    payload_id: str
    etag: str | None = None


PayloadItemOp = ReadHead | ChunkItems | DeleteItem


def delete_flow(
    payload_id: str, chosen: Callable[[dict[str, Any]], bool], *, head: bool
) -> Generator[PayloadItemOp, Any, None]:
    """Delete the manifest (``head``) and the ``chosen`` chunks; one gone already is fine."""
    if head:
        yield DeleteItem(MANIFEST, payload_id)
    for chunk in (yield ChunkItems(payload_id)):
        if chosen(chunk):
            yield DeleteItem(chunk["id"], payload_id)


def delete_stale_flow(info: PayloadInfo) -> Generator[PayloadItemOp, Any, bool]:
    """Delete ``info``'s put if its manifest is still that put's: the manifest under the
    ETag read (a put made again since keeps it), then the chunks of that put and of the
    puts before it. False when the payload was put again, or deleted, meanwhile."""
    head = yield ReadHead(info.payload_id)
    if head is None or not _same_put(head, info):
        return False
    if not (yield DeleteItem(MANIFEST, info.payload_id, head["_etag"])):
        return False
    yield from delete_flow(info.payload_id, lambda c: _replaced(c, info), head=False)
    return True


def _everything(_: dict[str, Any]) -> bool:
    return True


def _conditions(op: DeleteItem) -> dict[str, Any]:
    if op.etag is None:
        return {}
    return {"etag": op.etag, "match_condition": MatchConditions.IfNotModified}


def _gone(exc: cosmos_errors.CosmosHttpResponseError, op: DeleteItem) -> bool:
    """Whether a refused delete means the item is gone (or, guarded, changed)."""
    kind = refusal(exc)
    return kind is Refusal.MISSING or (op.etag is not None and kind is Refusal.STALE)


class CosmosPayloads:
    """A :class:`~docoutbox.ports.payloads.PayloadStore` on a container partitioned on
    ``/pid`` (:func:`create_payloads_container`)."""

    def __init__(self, container: Any, chunk_size: int = CHUNK_SIZE) -> None:
        self.container = container
        self.chunk_size = chunk_size

    def _read_head(self, payload_id: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = self.container.read_item(MANIFEST, partition_key=payload_id)
        except cosmos_errors.CosmosHttpResponseError as exc:
            if not _missing(exc):
                raise
            return None
        return head

    def put(self, info: PayloadInfo, data: bytes) -> None:
        chunks = _chunks(info, data, self.chunk_size)
        with translated():
            written = self.container.upsert_item(_head(info, len(chunks), False))
            for chunk in chunks:
                self.container.upsert_item(chunk)
            try:
                self.container.replace_item(
                    MANIFEST,
                    _head(info, len(chunks), True),
                    etag=written["_etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.STALE:
                    raise
                # Another put of the same payload (the same bytes) came in between.
                if (error := _unfinished(self._read_head(info.payload_id), info)) is not None:
                    raise error from exc

    def get(self, payload_id: str) -> bytes:
        with translated():
            head = self._read_head(payload_id)
            if head is None:
                return _assembled(None, [])
            chunks = list(self.container.query_items(**_query(payload_id)))
        return _assembled(head, chunks)

    def delete(self, payload_ids: Collection[str]) -> None:
        with translated():
            for payload_id in payload_ids:
                drive(delete_flow(payload_id, _everything, head=True), self._perform)

    def _perform(self, op: PayloadItemOp) -> Any:
        if isinstance(op, ReadHead):
            return self._read_head(op.payload_id)
        if isinstance(op, ChunkItems):
            return list(self.container.query_items(**_query(op.payload_id)))
        try:
            self.container.delete_item(op.item_id, partition_key=op.payload_id, **_conditions(op))
        except cosmos_errors.CosmosHttpResponseError as exc:
            if not _gone(exc, op):
                raise
            return False
        return True

    def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        with translated():
            heads = list(
                self.container.query_items(
                    _STALE,
                    parameters=[{"name": "@before", "value": format_time(before)}],
                    enable_cross_partition_query=True,
                )
            )
        return sorted((_info(h) for h in heads), key=lambda i: (i.stored_at, i.payload_id))[:limit]

    def delete_stale(self, info: PayloadInfo) -> bool:
        with translated():
            return drive(delete_stale_flow(info), self._perform)


class AsyncCosmosPayloads:
    """The async twin of :class:`CosmosPayloads` (``azure.cosmos.aio``)."""

    def __init__(self, container: Any, chunk_size: int = CHUNK_SIZE) -> None:
        self.container = container
        self.chunk_size = chunk_size

    async def _read_head(self, payload_id: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = await self.container.read_item(
                MANIFEST, partition_key=payload_id
            )
        except cosmos_errors.CosmosHttpResponseError as exc:
            if not _missing(exc):
                raise
            return None
        return head

    async def _chunk_items(self, payload_id: str) -> list[dict[str, Any]]:
        return [item async for item in self.container.query_items(**_query(payload_id))]

    async def put(self, info: PayloadInfo, data: bytes) -> None:
        chunks = _chunks(info, data, self.chunk_size)
        with translated():
            written = await self.container.upsert_item(_head(info, len(chunks), False))
            for chunk in chunks:
                await self.container.upsert_item(chunk)
            try:
                await self.container.replace_item(
                    MANIFEST,
                    _head(info, len(chunks), True),
                    etag=written["_etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.STALE:
                    raise
                head = await self._read_head(info.payload_id)
                if (error := _unfinished(head, info)) is not None:
                    raise error from exc

    async def get(self, payload_id: str) -> bytes:
        with translated():
            head = await self._read_head(payload_id)
            if head is None:
                return _assembled(None, [])
            chunks = await self._chunk_items(payload_id)
        return _assembled(head, chunks)

    async def delete(self, payload_ids: Collection[str]) -> None:
        with translated():
            for payload_id in payload_ids:
                await drive_async(delete_flow(payload_id, _everything, head=True), self._perform)

    async def _perform(self, op: PayloadItemOp) -> Any:
        if isinstance(op, ReadHead):
            return await self._read_head(op.payload_id)
        if isinstance(op, ChunkItems):
            return await self._chunk_items(op.payload_id)
        try:
            await self.container.delete_item(
                op.item_id, partition_key=op.payload_id, **_conditions(op)
            )
        except cosmos_errors.CosmosHttpResponseError as exc:
            if not _gone(exc, op):
                raise
            return False
        return True

    async def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        with translated():
            heads = [
                item
                async for item in self.container.query_items(
                    _STALE, parameters=[{"name": "@before", "value": format_time(before)}]
                )
            ]
        return sorted((_info(h) for h in heads), key=lambda i: (i.stored_at, i.payload_id))[:limit]

    async def delete_stale(self, info: PayloadInfo) -> bool:
        with translated():
            return await drive_async(delete_stale_flow(info), self._perform)
