"""Payloads split into chunks, for payload stores whose items are size-limited.

Rule: a put writes its manifest first, unfinished, then the chunks, then marks the
manifest finished; a reader takes a payload only from a finished manifest whose chunks
of its generation are all there, in order, with the manifest's total size. So a put cut
short at any step reads as missing, never as a shorter payload, and its manifest is
still found by the orphan sweep (by age), which removes it with its chunks.

Each put has its own ``generation``: chunks are named by it, so a put made again (a
slow handle refreshing its payload) never mixes its chunks with an earlier put's, and
the sweep's removal of an old put never touches a newer one's chunks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from docoutbox.errors import PayloadMissing
from docoutbox.ports.payloads import PayloadInfo


def split(data: bytes, size: int) -> list[bytes]:
    """``data`` in chunks of ``size`` bytes (at least one chunk, empty for no data)."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def chunk_name(payload_id: str, generation: str, number: int) -> str:
    """The key of chunk ``number`` of one put."""
    return f"{payload_id}.{generation}.{number:06d}"


def manifest(info: PayloadInfo, count: int, finished: bool) -> dict[str, Any]:
    """The manifest fields of a put of ``count`` chunks (without the store's own key)."""
    return {
        "payload_id": info.payload_id,
        "aggregate_id": info.aggregate_id,
        "entry_id": info.entry_id,
        "size": info.size,
        "stored_at": info.stored_at,
        "generation": info.generation,
        "count": count,
        "finished": finished,
    }


def info_of(doc: Mapping[str, Any], stored_at: Any = None) -> PayloadInfo:
    """The :class:`PayloadInfo` a manifest describes (``stored_at`` given as read back
    when the store keeps times in another form)."""
    return PayloadInfo(
        str(doc["payload_id"]),
        doc["aggregate_id"],
        str(doc["entry_id"]),
        int(doc["size"]),
        doc["stored_at"] if stored_at is None else stored_at,
        str(doc["generation"]),
    )


def assemble(head: Mapping[str, Any] | None, chunks: Iterable[tuple[int, bytes]]) -> bytes:
    """The payload a manifest and its generation's chunks ``(number, bytes)`` hold;
    :class:`~docoutbox.errors.PayloadMissing` unless the manifest is finished and the
    chunks are exactly its ``count`` and ``size``."""
    if head is None:
        raise PayloadMissing("no payload is stored under this ID")
    pid = head.get("payload_id")
    if not head.get("finished"):
        raise PayloadMissing(f"payload {pid}: its put did not finish")
    ordered = sorted(chunks, key=lambda chunk: chunk[0])
    if [number for number, _ in ordered] != list(range(int(head["count"]))):
        raise PayloadMissing(f"payload {pid}: chunks missing ({len(ordered)}/{head['count']})")
    data = b"".join(part for _, part in ordered)
    if len(data) != head["size"]:
        raise PayloadMissing(f"payload {pid}: {len(data)} bytes, {head['size']} expected")
    return data
