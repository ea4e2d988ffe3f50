"""Operating the outbox on Cosmos DB: backlog figures, pending work per feed range, dead
letters and leases, as on MongoDB.

Pending work (:func:`pending_work`) is one cross-partition query returning a small row
per item with pending entries (its aggregate ID, how many entries, the oldest
``created_at``), 1,000 rows a page: the request units grow with the pending items, plus
whatever the ``ARRAY_LENGTH(c.outbox) > 0`` filter costs to evaluate (the same filter as
the sweeps).
Each item's partition key is located in a feed range locally (the SDK's hash; answers
kept between scrapes), so the figures are per feed range, numbered as the feed-range
leases number them (sorted by their lower bound); ``by="partition"`` groups by the stored
``partition`` number instead.

Used by the ``docoutbox outbox``, ``docoutbox dead-letters`` and ``docoutbox leases``
commands with ``--cosmos-endpoint``, and usable directly. Dead letters are listed,
replayed and purged as :mod:`docoutbox.dispatch.tools.replay` says, here over containers: a
replay appends the entry with one patch, conditional on no pending entry having its
``seq``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import Any

from azure.cosmos import exceptions as cosmos_errors

from docoutbox.dispatch.engine import lag
from docoutbox.dispatch.engine.backlog import OutboxStats, probe_backend
from docoutbox.dispatch.tools import replay
from docoutbox.dispatch.tools.lease_rows import LeaseRow
from docoutbox.dispatch.tools.lease_rows import lease_rows as rows_of
from docoutbox.dispatch.tools.replay import GONE
from docoutbox.errors import InvalidInput, StoreError
from docoutbox.model import AggregateId
from docoutbox.store.document import utcnow
from docoutbox_cosmos.backend import CosmosBackend
from docoutbox_cosmos.clients import base_options, open_client
from docoutbox_cosmos.coordination import (
    _expiry,
    dead_letter_item_id,
    delete_if_present,
    read_or_none,
)
from docoutbox_cosmos.errors import (
    DRIVER_ERRORS,
    ContainerNotFound,
    Refusal,
    owner_missing,
    refusal,
    translate,
    translated,
)
from docoutbox_cosmos.items import ItemCodec, parse_time, to_json


def outbox_stats(container: Any) -> OutboxStats:
    """The backlog of ``container``: every item with pending entries, page by page."""
    return probe_backend(CosmosBackend(container))()


#: One row per item with pending entries: what the pending-work figures need, no more.
PENDING_WORK_SQL = (
    "SELECT c.aid, c.partition, ARRAY_LENGTH(c.outbox) AS n, "
    "(SELECT VALUE MIN(e.created_at) FROM e IN c.outbox) AS oldest "
    "FROM c WHERE ARRAY_LENGTH(c.outbox) > 0"
)
#: Partition keys whose feed range is remembered.
LOCATED_MEMORY = 100_000
#: Rows per page of the pending-work query (a row is about 100 bytes): 10,000 pending
#: items are 10 requests.
PENDING_WORK_PAGE = 1000


def _lower_bound(feed_range: Mapping[str, Any]) -> str:
    bounds = feed_range.get("Range")
    return str(bounds.get("min", "")) if isinstance(bounds, Mapping) else ""


class FeedRanges:
    """The feed ranges of ``container`` (sorted by lower bound, as the leases number
    them), and which one holds a partition key (hashed locally, answers kept)."""

    def __init__(self, container: Any) -> None:
        self.container = container
        self.ranges: list[dict[str, Any]] = []
        self._located: OrderedDict[str, int] = OrderedDict()

    def refresh(self) -> int:
        """Read the ranges again (one request; a split changes them); how many."""
        with translated():
            ranges = sorted(self.container.read_feed_ranges(), key=_lower_bound)
        if ranges != self.ranges:
            self.ranges = ranges
            self._located.clear()
        return len(ranges)

    def locate(self, pk: str) -> int:
        known = self._located.get(pk)
        if known is not None:
            return known
        with translated():
            point = self.container.feed_range_from_partition_key(pk)
            found = [
                i
                for i, r in enumerate(self.ranges)
                if self.container.is_feed_range_subset(r, point)
            ]
        if not found:
            raise StoreError(f"no feed range holds partition key {pk!r}")
        self._located[pk] = found[0]
        while len(self._located) > LOCATED_MEMORY:
            self._located.popitem(last=False)
        return found[0]


def pending_work(
    container: Any,
    *,
    by: str = lag.FEED_RANGE,
    ranges: FeedRanges | None = None,
    codec: ItemCodec | None = None,
    partitions: int | None = None,
    now: datetime | None = None,
) -> lag.PendingWork:
    """The pending work of ``container`` per feed range (``by="feed_range"``; pass the
    same ``ranges`` to every call to keep the located keys) or per stored partition
    number (``by="partition"``, with ``partitions`` adding the idle ones)."""
    if by not in (lag.FEED_RANGE, lag.PARTITION):
        raise InvalidInput(f"pending work is grouped by feed_range or partition, not {by!r}")
    codec = codec or ItemCodec()
    where: Callable[[dict[str, Any]], int | None]
    if by == lag.FEED_RANGE:
        ranges = ranges or FeedRanges(container)
        partitions = ranges.refresh()
        located = ranges

        def where(item: dict[str, Any]) -> int | None:
            return located.locate(codec.key(item["aid"])[1])
    else:

        def where(item: dict[str, Any]) -> int | None:
            partition = item.get("partition")
            return partition if type(partition) is int else None

    with translated():
        items = list(
            container.query_items(
                PENDING_WORK_SQL,
                enable_cross_partition_query=True,
                max_item_count=PENDING_WORK_PAGE,
            )
        )
    rows = []
    for item in items:
        oldest = parse_time(item.get("oldest"))
        rows.append(
            lag.Row(
                where(item),
                int(item.get("n") or 0),
                1,
                oldest if isinstance(oldest, datetime) else None,
            )
        )
    return lag.pending_work(rows, unit=by, partitions=partitions, now=now)


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


#: The fields of a dead-letter item shown as they are.
_SHOWN = ("aggregate_id", "entry", "error", "attempts", "origin", "queue", "body")


class CosmosDeadLetterStore:
    """The dead letters of one container, and the aggregates' container to replay into
    (see :mod:`docoutbox.dispatch.tools.replay`)."""

    def __init__(
        self, dead_letters: Any, aggregates: Any | None = None, codec: ItemCodec | None = None
    ) -> None:
        self.container = dead_letters
        self.items = aggregates
        self.aggregates = None if aggregates is None else str(aggregates.id)
        self.codec = codec or ItemCodec()

    @staticmethod
    def _shown(item: dict[str, Any]) -> dict[str, Any]:
        doc = {"_id": item.get("entry_id", item.get("id"))}
        doc |= {key: item[key] for key in _SHOWN if key in item}
        doc["quarantined_at"] = parse_time(item.get("quarantined_at"))
        return doc

    def _query(self, sql: str) -> Any:
        return self.container.query_items(sql, enable_cross_partition_query=True)

    def listing(self, limit: int) -> list[dict[str, Any]]:
        with translated():
            items = self._query("SELECT * FROM c ORDER BY c.quarantined_at")
            return [self._shown(item) for item in islice(items, limit or None)]

    def count(self) -> int:
        with translated():
            return int(next(iter(self._query("SELECT VALUE COUNT(1) FROM c")), 0))

    def find(self, dead_letter_id: str) -> dict[str, Any] | None:
        with translated():
            item = read_or_none(self.container, dead_letter_item_id(dead_letter_id))
        return None if item is None else self._shown(item)

    def delete(self, ids: Sequence[str] | None) -> int:
        with translated():
            if ids is None:
                item_ids = [row["id"] for row in self._query("SELECT c.id FROM c")]
            else:
                item_ids = [dead_letter_item_id(name) for name in ids]
            # An item deleted meanwhile is not counted.
            return sum(delete_if_present(self.container, item_id) for item_id in item_ids)

    def aggregate_type(self, aggregate_id: AggregateId) -> object:
        assert self.items is not None
        item_id, key = self.codec.key(aggregate_id)
        with translated(aggregate_id):
            item = read_or_none(self.items, item_id, key)
        return GONE if item is None else item.get("type")

    def append(self, aggregate_id: AggregateId, entry: dict[str, Any]) -> bool:
        assert self.items is not None
        item_id, key = self.codec.key(aggregate_id)
        pending = f'FROM c WHERE NOT ARRAY_CONTAINS(c.outbox, {{"seq": {int(entry["seq"])}}}, true)'
        with translated(aggregate_id):
            try:
                self.items.patch_item(
                    item_id,
                    partition_key=key,
                    patch_operations=[{"op": "add", "path": "/outbox/-", "value": to_json(entry)}],
                    filter_predicate=pending,
                )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.STALE:
                    raise
                return False  # an entry with that seq is pending
        return True


class DeadLetterAdmin(replay.DeadLetterAdmin):
    """List, show, replay and purge the dead letters of one database."""

    def __init__(
        self, dead_letters: Any, aggregates: Any | None = None, values: Any | None = None
    ) -> None:
        super().__init__(CosmosDeadLetterStore(dead_letters, aggregates), values)


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
        db = client.get_database_client(database)
        try:
            db.read()
        except DRIVER_ERRORS as exc:
            if owner_missing(exc, container_request=True):
                raise ContainerNotFound(database, None) from exc
            raise translate(exc) from exc
    except BaseException:
        client.close()
        raise
    return client, CosmosDatabase(db)


def claim_ports(
    database: CosmosDatabase, container: str, dead_letters: str
) -> tuple[Any, Any, Any]:
    """The store backend of ``container``, the payload container beside it and the
    dead letters (for the orphan sweep of the claim check; created when missing)."""
    from docoutbox_cosmos.clients import coordination_container  # noqa: PLC0415
    from docoutbox_cosmos.coordination import CosmosDeadLetters  # noqa: PLC0415
    from docoutbox_cosmos.payloads import (  # noqa: PLC0415
        CosmosPayloads,
        create_payloads_container,
        payloads_container,
    )

    side = create_payloads_container(database.database, payloads_container(container))
    letters = CosmosDeadLetters(coordination_container(database.database, dead_letters))
    return CosmosBackend(database[container]), CosmosPayloads(side), letters
