"""The Cosmos DB payload store's deletes, decided once for both twins: a stale put's
manifest is deleted under the ETag read, then only the chunks of that put and of the
puts before it; a payload put again (or deleted) meanwhile is kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from docoutbox.drive import drive
from docoutbox.ports.payloads import PayloadInfo
from docoutbox_cosmos.items import format_time
from docoutbox_cosmos.payloads import (
    MANIFEST,
    ChunkItems,
    DeleteItem,
    ReadHead,
    delete_flow,
    delete_stale_flow,
)

PUT = datetime(2026, 1, 1, tzinfo=UTC)
INFO = PayloadInfo("p", "a", "e", 3, PUT, "g1")


class Partition:
    """One payload's items; a delete under an ETag fails if the manifest changed."""

    def __init__(self, head: dict[str, Any] | None, chunks: list[dict[str, Any]]) -> None:
        self.items: dict[str, dict[str, Any]] = {c["id"]: c for c in chunks}
        if head is not None:
            self.items[MANIFEST] = head
        self.ops: list[Any] = []

    def perform(self, op: Any) -> Any:
        self.ops.append(op)
        if isinstance(op, ReadHead):
            return self.items.get(MANIFEST)
        if isinstance(op, ChunkItems):
            return [item for key, item in self.items.items() if key != MANIFEST]
        assert isinstance(op, DeleteItem)
        item = self.items.get(op.item_id)
        if item is None or (op.etag is not None and item["_etag"] != op.etag):
            return False
        del self.items[op.item_id]
        return True


def head(generation: str, at: datetime) -> dict[str, Any]:
    return {"generation": generation, "stored_at": format_time(at), "_etag": f"etag-{generation}"}


def chunk(generation: str, at: datetime, n: int = 0) -> dict[str, Any]:
    return {"id": f"p.{generation}.{n}", "g": generation, "n": n, "t": format_time(at)}


def test_a_stale_put_is_deleted_with_its_chunks_and_older_ones_only() -> None:
    later = PUT + timedelta(seconds=5)
    partition = Partition(
        head("g1", PUT), [chunk("g1", PUT), chunk("g0", PUT - timedelta(1)), chunk("g2", later)]
    )
    assert drive(delete_stale_flow(INFO), partition.perform) is True
    assert set(partition.items) == {"p.g2.0"}  # a later put's chunk stays
    assert DeleteItem(MANIFEST, "p", "etag-g1") in partition.ops


def test_a_payload_put_again_or_gone_is_kept() -> None:
    again = Partition(head("g2", PUT + timedelta(seconds=5)), [chunk("g2", PUT)])
    assert drive(delete_stale_flow(INFO), again.perform) is False
    assert len(again.items) == 2 and not any(isinstance(o, DeleteItem) for o in again.ops)
    gone = Partition(None, [chunk("g1", PUT)])
    assert drive(delete_stale_flow(INFO), gone.perform) is False
    assert len(gone.items) == 1


def test_a_manifest_changed_after_the_read_keeps_the_chunks() -> None:
    partition = Partition(head("g1", PUT), [chunk("g1", PUT)])

    def racing(op: Any) -> Any:
        if isinstance(op, DeleteItem) and op.etag is not None:
            partition.items[MANIFEST] = {**partition.items[MANIFEST], "_etag": "new"}
        return partition.perform(op)

    assert drive(delete_stale_flow(INFO), racing) is False
    assert "p.g1.0" in partition.items


def test_delete_removes_the_manifest_and_every_chunk() -> None:
    partition = Partition(head("g1", PUT), [chunk("g1", PUT), chunk("g1", PUT, 1)])
    drive(delete_flow("p", lambda _: True, head=True), partition.perform)
    assert partition.items == {}
    assert partition.ops[0] == DeleteItem(MANIFEST, "p")  # unconditional
