"""The stores a schedule runs against: in memory, or fresh collections on a MongoDB server."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from docoutbox.store.document import Document
from docoutbox.store.ports import StoreBackend
from docoutbox.testing import MemoryBackend


@dataclass
class Stores:
    producers: StoreBackend
    sinks: StoreBackend
    #: The producers' change log (every written document, in order), when the store has one.
    changes: list[Document] | None
    close: Callable[[], None]


def memory_stores() -> Stores:
    producers = MemoryBackend()
    return Stores(producers, MemoryBackend(), producers.changes, lambda: None)


def wire_stores(client: Any, seed: int) -> Stores:
    """Two fresh collections for one schedule, dropped by ``close``."""
    from docoutbox_mongo import MongoBackend

    db = client["docoutbox_sim"]
    prefix = f"s{seed}_{uuid.uuid4().hex[:8]}"
    producers, sinks = db[f"{prefix}_producers"], db[f"{prefix}_sinks"]

    def close() -> None:
        producers.drop()
        sinks.drop()

    return Stores(MongoBackend(producers), MongoBackend(sinks), None, close)
