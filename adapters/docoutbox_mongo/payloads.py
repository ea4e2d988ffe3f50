"""The claim check's payload store on MongoDB: one side collection, GridFS-like chunks.

Layout (:mod:`docoutbox.stored.chunks` keeps the rules)::

    {_id: <payload ID>, kind: "manifest", payload_id, aggregate_id, entry_id, size,
     stored_at, generation, count, finished}
    {_id: "<payload ID>.<generation>.<n>", kind: "chunk", p: <payload ID>,
     g: <generation>, n, t: <stored_at of its put>, data: <binary>}

A put upserts the manifest unfinished, inserts its chunks, then marks the manifest
finished (if it is still its generation). pymongo's ``gridfs`` (which the wire server
serves) is not used: a GridFS file has no manifest to replace or delete conditionally,
which the sweep's ``delete_stale`` and a put made again need.
Both twins build their filters and documents with the functions below and only call
the driver. ``ensure_indexes`` creates the two indexes every query of the side collection
needs beyond ``_id`` (:data:`INDEXES`): the orphan sweep's listing of stale manifests and
the chunks of a payload.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from bson import Binary

from docoutbox.errors import TransientStoreError
from docoutbox.ports.payloads import PayloadInfo
from docoutbox.stored.chunks import assemble, chunk_name, info_of, manifest, split
from docoutbox_mongo.errors import translated

#: Bytes per chunk document (well under MongoDB's 16 MB document limit).
CHUNK_SIZE = 1024 * 1024
_MANIFEST = {"kind": "manifest"}

#: The side collection's indexes, ``(name, keys, options)``: manifests by the time put
#: (the sweep's :func:`stale_query`, partial: chunks are not in it), and chunks by payload
#: generation and put time (a get, a delete, a sweep's delete of a put's chunks).
INDEXES: tuple[tuple[str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("docoutbox_payload_stale", [("stored_at", 1)], {"partialFilterExpression": _MANIFEST}),
    ("docoutbox_payload_chunks", [("p", 1), ("g", 1), ("t", 1)], {}),
)


def payloads_collection(collection: str) -> str:
    """The side collection holding the payloads of ``collection``'s entries."""
    return f"{collection}_payloads"


def _aware(value: Any) -> Any:
    return value.replace(tzinfo=UTC) if isinstance(value, datetime) and not value.tzinfo else value


def _head(info: PayloadInfo, count: int, finished: bool) -> dict[str, Any]:
    return {"_id": info.payload_id, **_MANIFEST, **manifest(info, count, finished)}


def _chunks(info: PayloadInfo, data: bytes, size: int) -> list[dict[str, Any]]:
    return [
        {
            "_id": chunk_name(info.payload_id, info.generation, number),
            "kind": "chunk",
            "p": info.payload_id,
            "g": info.generation,
            "n": number,
            "t": info.stored_at,
            "data": Binary(part),
        }
        for number, part in enumerate(split(data, size))
    ]


def _finish(info: PayloadInfo) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"_id": info.payload_id, "generation": info.generation}, {"$set": {"finished": True}}


def _check_replaced(head: dict[str, Any] | None, info: PayloadInfo) -> None:
    """After a put whose manifest another put of the same payload (the same bytes)
    replaced: fine if that put finished, else the put failed."""
    if head is None or not head.get("finished"):
        raise TransientStoreError(
            f"payload {info.payload_id}: another put replaced this one and did not finish"
        )


def _parts(chunks: list[dict[str, Any]]) -> list[tuple[int, bytes]]:
    return [(int(c["n"]), bytes(c["data"])) for c in chunks]


def _same_put(info: PayloadInfo) -> dict[str, Any]:
    return {"_id": info.payload_id, "generation": info.generation, "stored_at": info.stored_at}


def stale_query(before: datetime) -> dict[str, Any]:
    """The manifests put before ``before`` (sorted by ``stored_at``: :data:`INDEXES`)."""
    return {**_MANIFEST, "stored_at": {"$lt": before}}


def _put_chunks(info: PayloadInfo) -> dict[str, Any]:
    """The chunks of ``info``'s put and of every put before it."""
    return {"p": info.payload_id, "$or": [{"g": info.generation}, {"t": {"$lt": info.stored_at}}]}


class MongoPayloads:
    """A :class:`~docoutbox.ports.payloads.PayloadStore` on a side collection."""

    def __init__(self, collection: Any, chunk_size: int = CHUNK_SIZE) -> None:
        self.collection = collection
        self.chunk_size = chunk_size

    def ensure_indexes(self) -> None:
        """Create :data:`INDEXES` (idempotent)."""
        with translated():
            for name, keys, options in INDEXES:
                self.collection.create_index(keys, name=name, **options)

    def put(self, info: PayloadInfo, data: bytes) -> None:
        chunks = _chunks(info, data, self.chunk_size)
        with translated():
            self.collection.replace_one(
                {"_id": info.payload_id}, _head(info, len(chunks), False), upsert=True
            )
            for chunk in chunks:  # one at a time: a request stays near one chunk's size
                self.collection.replace_one({"_id": chunk["_id"]}, chunk, upsert=True)
            if self.collection.update_one(*_finish(info)).matched_count == 1:
                return
            head = self.collection.find_one({"_id": info.payload_id, **_MANIFEST})
        _check_replaced(head, info)

    def get(self, payload_id: str) -> bytes:
        with translated():
            head = self.collection.find_one({"_id": payload_id, **_MANIFEST})
            if head is None:
                return assemble(None, ())
            chunks = list(self.collection.find({"p": payload_id, "g": head["generation"]}))
        return assemble(head, _parts(chunks))

    def delete(self, payload_ids: Collection[str]) -> None:
        ids = list(payload_ids)
        with translated():
            self.collection.delete_many({"_id": {"$in": ids}, **_MANIFEST})
            self.collection.delete_many({"p": {"$in": ids}})

    def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        with translated():
            docs = list(self.collection.find(stale_query(before)).sort("stored_at", 1).limit(limit))
        return [info_of(doc, _aware(doc["stored_at"])) for doc in docs]

    def delete_stale(self, info: PayloadInfo) -> bool:
        with translated():
            if self.collection.delete_one(_same_put(info)).deleted_count != 1:
                return False
            self.collection.delete_many(_put_chunks(info))
        return True


class AsyncMongoPayloads:
    """The async twin of :class:`MongoPayloads` (pymongo async or Motor)."""

    def __init__(self, collection: Any, chunk_size: int = CHUNK_SIZE) -> None:
        self.collection = collection
        self.chunk_size = chunk_size

    async def ensure_indexes(self) -> None:
        """Create :data:`INDEXES` (idempotent)."""
        with translated():
            for name, keys, options in INDEXES:
                await self.collection.create_index(keys, name=name, **options)

    async def put(self, info: PayloadInfo, data: bytes) -> None:
        chunks = _chunks(info, data, self.chunk_size)
        with translated():
            await self.collection.replace_one(
                {"_id": info.payload_id}, _head(info, len(chunks), False), upsert=True
            )
            for chunk in chunks:
                await self.collection.replace_one({"_id": chunk["_id"]}, chunk, upsert=True)
            if (await self.collection.update_one(*_finish(info))).matched_count == 1:
                return
            head = await self.collection.find_one({"_id": info.payload_id, **_MANIFEST})
        _check_replaced(head, info)

    async def get(self, payload_id: str) -> bytes:
        with translated():
            head = await self.collection.find_one({"_id": payload_id, **_MANIFEST})
            if head is None:
                return assemble(None, ())
            cursor = self.collection.find({"p": payload_id, "g": head["generation"]})
            chunks = [doc async for doc in cursor]
        return assemble(head, _parts(chunks))

    async def delete(self, payload_ids: Collection[str]) -> None:
        ids = list(payload_ids)
        with translated():
            await self.collection.delete_many({"_id": {"$in": ids}, **_MANIFEST})
            await self.collection.delete_many({"p": {"$in": ids}})

    async def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        with translated():
            cursor = self.collection.find(stale_query(before)).sort("stored_at", 1).limit(limit)
            docs = [doc async for doc in cursor]
        return [info_of(doc, _aware(doc["stored_at"])) for doc in docs]

    async def delete_stale(self, info: PayloadInfo) -> bool:
        with translated():
            result = await self.collection.delete_one(_same_put(info))
            if result.deleted_count != 1:
                return False
            await self.collection.delete_many(_put_chunks(info))
        return True
