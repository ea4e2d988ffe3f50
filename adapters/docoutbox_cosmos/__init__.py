"""Azure Cosmos DB adapter for docoutbox: azure-cosmos sync and aio, change feed, leases."""

from docoutbox_cosmos.backend import AsyncCosmosBackend, ChargeHook, CosmosBackend
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource
from docoutbox_cosmos.coordination import (
    AsyncCosmosCheckpoints,
    AsyncCosmosDeadLetters,
    CosmosCheckpoints,
    CosmosDeadLetters,
    CosmosLeaseTable,
)
from docoutbox_cosmos.errors import Throttled
from docoutbox_cosmos.items import MAX_ITEM_BYTES, ItemCodec, decode_id, encode_id
from docoutbox_cosmos.leases import CosmosFeedRangeLeases, LeasedChangeSource
from docoutbox_cosmos.wiring import CosmosDispatchTarget, connect_dispatch

__all__ = [
    "MAX_ITEM_BYTES",
    "AsyncCosmosBackend",
    "AsyncCosmosChangeSource",
    "AsyncCosmosCheckpoints",
    "AsyncCosmosDeadLetters",
    "ChargeHook",
    "CosmosBackend",
    "CosmosChangeSource",
    "CosmosCheckpoints",
    "CosmosDeadLetters",
    "CosmosDispatchTarget",
    "CosmosFeedRangeLeases",
    "CosmosLeaseTable",
    "ItemCodec",
    "LeasedChangeSource",
    "Throttled",
    "connect_dispatch",
    "decode_id",
    "encode_id",
]
