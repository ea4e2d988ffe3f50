"""Azure Cosmos DB adapter for docoutbox: azure-cosmos sync and aio, change feed, leases.

- :mod:`docoutbox_cosmos.backend`: the store backends (:class:`CosmosBackend`,
  :class:`AsyncCosmosBackend`); :mod:`docoutbox_cosmos.items` and
  :mod:`docoutbox_cosmos.operations`: documents as items, plans as patches and batches;
- :mod:`docoutbox_cosmos.archive`: the inbox archive of a spilling inbox;
- :mod:`docoutbox_cosmos.changes`: the change feed as a change source;
- :mod:`docoutbox_cosmos.coordination`: checkpoints, lease items and dead letters;
  :mod:`docoutbox_cosmos.leases`: one lease per feed range, carrying its continuation;
- :mod:`docoutbox_cosmos.clients`: sync and aio clients, TLS options, coordination
  containers;
- :mod:`docoutbox_cosmos.kit` and :mod:`docoutbox_cosmos.aio`: the kits
  (:func:`open_kit`, :func:`open_async_kit`) and the ``docoutbox.stores`` adapter;
- :mod:`docoutbox_cosmos.payloads`: the claim check's payload store (a side container,
  one logical partition per payload);
- :mod:`docoutbox_cosmos.admin`: backlog, dead letters and lease rows for the operator
  commands;
- :mod:`docoutbox_cosmos.errors`: the one translation of SDK errors (by status code);
  :mod:`docoutbox_cosmos.existence`: which of a container and its database is missing.
"""

from docoutbox_cosmos.aio import AsyncCosmosKit, open_async_kit
from docoutbox_cosmos.backend import AsyncCosmosBackend, CosmosBackend
from docoutbox_cosmos.clients import tls_options
from docoutbox_cosmos.errors import Throttled
from docoutbox_cosmos.kit import CosmosKit, open_kit

__all__ = [
    "AsyncCosmosBackend",
    "AsyncCosmosKit",
    "CosmosBackend",
    "CosmosKit",
    "Throttled",
    "open_async_kit",
    "open_kit",
    "tls_options",
]
