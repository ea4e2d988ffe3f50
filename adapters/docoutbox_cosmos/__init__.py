"""Azure Cosmos DB adapter for docoutbox: azure-cosmos sync and aio, change feed, leases."""

from docoutbox_cosmos.backend import AsyncCosmosBackend, CosmosBackend
from docoutbox_cosmos.errors import Throttled
from docoutbox_cosmos.items import MAX_ITEM_BYTES, ItemCodec, decode_id, encode_id

__all__ = [
    "MAX_ITEM_BYTES",
    "AsyncCosmosBackend",
    "CosmosBackend",
    "ItemCodec",
    "Throttled",
    "decode_id",
    "encode_id",
]
