"""The stores a schedule runs against: in memory, or fresh collections on a MongoDB server,
or fresh containers on a Cosmos DB account."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from docoutbox.ports.store import StoreBackend
from docoutbox.store.document import Document
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


def cosmos_stores(database: Any, seed: int) -> Stores:
    """Two fresh containers of a Cosmos DB ``DatabaseProxy`` for one schedule, deleted by
    ``close``."""
    from azure.cosmos import PartitionKey

    from docoutbox_cosmos import CosmosBackend

    prefix = f"s{seed}_{uuid.uuid4().hex[:8]}"
    producers, sinks = (
        database.create_container(f"{prefix}_{side}", PartitionKey(path="/id"))
        for side in ("producers", "sinks")
    )

    def close() -> None:
        database.delete_container(producers.id)
        database.delete_container(sinks.id)

    return Stores(CosmosBackend(producers), CosmosBackend(sinks), None, close)
