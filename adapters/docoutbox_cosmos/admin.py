"""Operating the outbox on Cosmos DB: backlog figures and leases, as on MongoDB.

Used by ``docoutbox outbox stats`` and ``docoutbox leases`` with ``--cosmos-endpoint``,
and usable directly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from docoutbox.dispatch.backlog import OutboxStats, probe_backend
from docoutbox.dispatch.lease_rows import LeaseRow
from docoutbox.dispatch.lease_rows import lease_rows as rows_of
from docoutbox.store.document import utcnow
from docoutbox_cosmos.backend import CosmosBackend
from docoutbox_cosmos.coordination import _expiry
from docoutbox_cosmos.errors import translated
from docoutbox_cosmos.wiring import base_options, open_client


def outbox_stats(container: Any) -> OutboxStats:
    """The backlog of ``container``: every item with pending entries, page by page."""
    return probe_backend(CosmosBackend(container))()


def lease_rows(
    container: Any, group: str | None = None, now: datetime | None = None
) -> list[LeaseRow]:
    """Every lease and member heartbeat of the lease ``container`` (of ``group``, or of
    all groups), in partition (feed range) order."""
    query, parameters = "SELECT * FROM c", []
    if group is not None:
        query += " WHERE c.group = @group"
        parameters.append({"name": "@group", "value": group})
    with translated():
        items = list(
            container.query_items(query, parameters=parameters, enable_cross_partition_query=True)
        )
    return rows_of(items, now or utcnow(), _expiry)


class CosmosDatabase:
    """A database's containers by name (``database[name]``), as pymongo's databases."""

    def __init__(self, database: Any) -> None:
        self.database = database

    def __getitem__(self, name: str) -> Any:
        return self.database.get_container_client(name)


def connect_database(
    endpoint: str,
    key: str,
    database: str,
    *,
    timeout: float | None = None,
    client_options: dict[str, Any] | None = None,
) -> tuple[Any, CosmosDatabase]:
    """A client and its ``database``, once the account answered. Raises
    :class:`~docoutbox.errors.StoreError` for a bad endpoint or key, an unreachable
    account or a missing database."""
    client = open_client(endpoint, key, **{**base_options(timeout), **(client_options or {})})
    try:
        with translated():
            db = client.get_database_client(database)
            db.read()
    except BaseException:
        client.close()
        raise
    return client, CosmosDatabase(db)
