"""In-memory payload stores (:mod:`docoutbox.ports.payloads`), for tests and the simulation.

Rule: the reference semantics of a payload store. A put is visible whole at once;
``delete_stale`` removes only the put it was shown. Every operation is recorded in
``log`` as ``(name, payload_id)``.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from datetime import datetime

from docoutbox.errors import PayloadMissing
from docoutbox.ports.payloads import PayloadInfo


class MemoryPayloads:
    """Payloads in a dict, guarded by a lock."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[PayloadInfo, bytes]] = {}
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def put(self, info: PayloadInfo, data: bytes) -> None:
        with self._lock:
            self.log.append(("put", info.payload_id))
            self.items[info.payload_id] = (info, bytes(data))

    def get(self, payload_id: str) -> bytes:
        with self._lock:
            self.log.append(("get", payload_id))
            found = self.items.get(payload_id)
        if found is None:
            raise PayloadMissing(f"payload {payload_id} is not stored")
        return found[1]

    def delete(self, payload_ids: Collection[str]) -> None:
        with self._lock:
            for payload_id in payload_ids:
                self.log.append(("delete", payload_id))
                self.items.pop(payload_id, None)

    def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        with self._lock:
            old = [info for info, _ in self.items.values() if info.stored_at < before]
        # Equal times in the order of first put (a seeded simulation replays it).
        return sorted(old, key=lambda info: info.stored_at)[:limit]

    def delete_stale(self, info: PayloadInfo) -> bool:
        with self._lock:
            found = self.items.get(info.payload_id)
            if found is None or found[0] != info:
                return False
            self.log.append(("delete_stale", info.payload_id))
            del self.items[info.payload_id]
            return True


class AsyncMemoryPayloads:
    """The async twin of :class:`MemoryPayloads`, over one (``sync``, to share it)."""

    def __init__(self, sync: MemoryPayloads | None = None) -> None:
        self.sync = sync if sync is not None else MemoryPayloads()

    async def put(self, info: PayloadInfo, data: bytes) -> None:
        self.sync.put(info, data)

    async def get(self, payload_id: str) -> bytes:
        return self.sync.get(payload_id)

    async def delete(self, payload_ids: Collection[str]) -> None:
        self.sync.delete(payload_ids)

    async def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        return self.sync.stale(before, limit)

    async def delete_stale(self, info: PayloadInfo) -> bool:
        return self.sync.delete_stale(info)
