"""Dispatcher coordination in Cosmos DB containers: checkpoints, leases, dead letters.

Each container is partitioned on ``/id``; item IDs are encoded with
:func:`~docoutbox_cosmos.items.encode_id`.

- :class:`CosmosCheckpoints`: ``{id: <dispatcher name>, name, position, updated_at}``.
- :class:`CosmosLeaseTable`: per group, one lease item per partition,
  ``{id: "<group>/lease/<partition>", group, kind: "lease", partition, owner, expires_at,
  timestamp}``, and one membership item per instance ``{id: "<group>/member/<owner>",
  kind: "member", owner, expires_at}``. Acquiring a free lease creates it (a race loser
  gets 409); taking over an expired one, or renewing, replaces it under the ETag that
  was read (a race loser gets 412); releasing clears the owner under a predicate on the
  owner. Every lost race is False, never an error.
- :class:`CosmosDeadLetters`: ``{id: <entry id>, aggregate_id, entry, error, attempts,
  quarantined_at}``, and ``claim_id`` (the payload ID) for a claim-checked entry, since
  ``entry`` is stored as JSON text; a second ``put`` of the same entry is a no-op (409).
  ``refers_to`` answers the orphan sweep: whether a dead letter holds that payload.

Checkpoints and dead letters have ``azure.cosmos.aio`` twins. The dispatcher's leases by
feed range are in :mod:`docoutbox_cosmos.leases`; :class:`CosmosLeaseTable` leases the
partition numbers stored on the documents instead, as the MongoDB adapter does.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.model import AggregateId
from docoutbox.ports.dispatch import LeaseView, Position
from docoutbox.store.document import utcnow
from docoutbox.stored.reference import claim_of
from docoutbox_cosmos.errors import Refusal, refusal, translated
from docoutbox_cosmos.items import encode_id, format_time, literal, parse_time, to_json

_FREE = datetime(1970, 1, 1, tzinfo=UTC)
#: How many lease renewals one heartbeat sends at once.
RENEW_CONCURRENCY = 8


def read_or_none(container: Any, item_id: str, partition_key: str | None = None) -> Any:
    """The item, or None where there is none (404); any other error is raised."""
    try:
        key = item_id if partition_key is None else partition_key
        return container.read_item(item_id, partition_key=key)
    except cosmos_errors.CosmosHttpResponseError as exc:
        if refusal(exc) is not Refusal.MISSING:
            raise
        return None


def delete_if_present(container: Any, item_id: str) -> bool:
    """Delete the item (partitioned on ``/id``); False where there was none (404)."""
    try:
        container.delete_item(item_id, partition_key=item_id)
    except cosmos_errors.CosmosHttpResponseError as exc:
        if refusal(exc) is not Refusal.MISSING:
            raise
        return False
    return True


def _expiry(value: object) -> datetime | None:
    parsed = parse_time(value)
    return parsed if isinstance(parsed, datetime) else None


def checkpoint_item(name: str, position: Position) -> dict[str, Any]:
    """The checkpoint item of dispatcher ``name`` (sync and aio write the same)."""
    item_id = encode_id(name)
    body = {"id": item_id, "name": name, "position": to_json(position)}
    body["updated_at"] = format_time(utcnow())
    return body


def dead_letter_item_id(entry_id: str) -> str:
    """The item ID of the dead letter of the entry ``entry_id`` (entry IDs may hold
    characters Cosmos DB refuses in item IDs, and be longer)."""
    return encode_id(hashlib.sha256(entry_id.encode()).hexdigest()[:32])


def dead_letter_item(
    aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
) -> dict[str, Any]:
    """The dead-letter item of ``entry``: its ID is derived from the entry's, so a second
    ``put`` of the same entry is a 409 (sync and aio write the same)."""
    entry_id = entry.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        digest = hashlib.sha256(repr(sorted(entry.items(), key=str)).encode()).hexdigest()
        entry_id = f"{aggregate_id}/malformed/{digest[:24]}"
    item = {
        "id": dead_letter_item_id(entry_id),
        "entry_id": entry_id,
        "aggregate_id": aggregate_id,
        "entry": to_json(entry),
        "error": error,
        "attempts": attempts,
        "quarantined_at": format_time(utcnow()),
    }
    claim = claim_of(entry)
    if claim is not None and isinstance(claim.get("id"), str):
        item[CLAIM_ID] = claim["id"]
    return item


#: The field of a dead-letter item naming the payload of its claim-checked entry.
CLAIM_ID = "claim_id"
#: The query of :meth:`CosmosDeadLetters.refers_to`.
CLAIMED = f"SELECT VALUE COUNT(1) FROM c WHERE c.{CLAIM_ID} = @id"


class CosmosCheckpoints:
    def __init__(self, container: Any) -> None:
        self.container = container

    def load(self, name: str) -> Position | None:
        with translated():
            item = read_or_none(self.container, encode_id(name))
        return None if item is None else item.get("position")

    def save(self, name: str, position: Position) -> None:
        with translated():
            self.container.upsert_item(checkpoint_item(name, position))


class AsyncCosmosCheckpoints:
    """The async twin of :class:`CosmosCheckpoints`, over an ``azure.cosmos.aio``
    container."""

    def __init__(self, container: Any) -> None:
        self.container = container

    async def load(self, name: str) -> Position | None:
        item_id = encode_id(name)
        with translated():
            try:
                item = await self.container.read_item(item_id, partition_key=item_id)
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.MISSING:
                    raise
                return None
        return item.get("position")

    async def save(self, name: str, position: Position) -> None:
        with translated():
            await self.container.upsert_item(checkpoint_item(name, position))


class GroupItems:
    """What both Cosmos lease tables share: the items of one ``group`` in a lease
    container (partitioned on ``/id``), and the member records of its instances."""

    def __init__(self, container: Any, group: str) -> None:
        self.container = container
        self.group = group
        #: The renewals' threads: one pool for the table's life (made at the first
        #: heartbeat that renews two leases or more), shut down by :meth:`close`.
        self._renewals: ThreadPoolExecutor | None = None
        self._renewals_lock = threading.Lock()

    def close(self) -> None:
        """Shut the renewals' pool down (waiting for renewals under way). A renewal after
        this starts a new pool; the kit closes its table when it closes."""
        with self._renewals_lock:
            pool, self._renewals = self._renewals, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _renewal_pool(self) -> ThreadPoolExecutor:
        with self._renewals_lock:
            if self._renewals is None:
                self._renewals = ThreadPoolExecutor(
                    RENEW_CONCURRENCY, thread_name_prefix=f"docoutbox-renew-{self.group}"
                )
            return self._renewals

    def _member_id(self, owner: str) -> str:
        return encode_id(f"{self.group}/member/{owner}")

    def _read_group(self) -> tuple[dict[int, tuple[str, datetime]], dict[str, datetime]]:
        """The unexpired-or-not leases (partition -> owner, expiry) and members."""
        leases: dict[int, tuple[str, datetime]] = {}
        members: dict[str, datetime] = {}
        with translated():
            items = list(
                self.container.query_items(
                    "SELECT * FROM c WHERE c.group = @group",
                    parameters=[{"name": "@group", "value": self.group}],
                    enable_cross_partition_query=True,
                )
            )
        for item in items:
            owner, expires = item.get("owner"), _expiry(item.get("expires_at"))
            if not isinstance(owner, str) or expires is None:
                continue
            if item.get("kind") == "member":
                members[owner] = expires
            elif item.get("kind") == "lease" and isinstance(item.get("partition"), int):
                leases[item["partition"]] = (owner, expires)
        return leases, members

    def join(self, owner: str, expires_at: datetime) -> None:
        """Refresh ``owner``'s member record (one patch), or create it with ``joined_at``."""
        item_id = self._member_id(owner)
        expiry = format_time(expires_at)
        refresh = [{"op": "set", "path": "/expires_at", "value": expiry}]
        body = {"id": item_id, "group": self.group, "kind": "member", "owner": owner}
        body |= {"expires_at": expiry, "joined_at": format_time(utcnow())}
        with translated():
            try:
                self.container.patch_item(item_id, partition_key=item_id, patch_operations=refresh)
                return
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.MISSING:
                    raise
            try:
                self.container.create_item(body)
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.EXISTS:
                    raise
                # Created meanwhile (a create whose reply was lost, retried): refresh it.
                self.container.patch_item(item_id, partition_key=item_id, patch_operations=refresh)

    def leave(self, owner: str) -> None:
        with translated():
            delete_if_present(self.container, self._member_id(owner))

    def _renew_each(
        self,
        partitions: Collection[int],
        owner: str,
        expires_at: datetime,
        write: Callable[[int, str, dict[str, Any]], object],
    ) -> None:
        """Renew each lease with ``write`` (its conditional write), concurrently (up to
        :data:`RENEW_CONCURRENCY`, on the table's one pool): a heartbeat must fit well
        inside the TTL however many partitions it holds."""
        stamp = {"expires_at": format_time(expires_at), "timestamp": format_time(utcnow())}
        held = sorted(partitions)
        if len(held) <= 1:
            for partition in held:
                write(partition, owner, stamp)
            return
        pool = self._renewal_pool()
        futures = [pool.submit(write, p, owner, stamp) for p in held]
        # Every renewal ends before the heartbeat goes on; then the first failure
        # (translated) is raised.
        failures = [error for error in (f.exception() for f in futures) if error is not None]
        if failures:
            raise failures[0]


class CosmosLeaseTable(GroupItems):
    """The leases of one ``group`` (usually the dispatched container's name)."""

    def _lease_id(self, partition: int) -> str:
        return encode_id(f"{self.group}/lease/{partition}")

    def read(self) -> LeaseView:
        return LeaseView(*self._read_group())

    def _lease(
        self, partition: int, owner: str, now: datetime, expires_at: datetime
    ) -> dict[str, Any]:
        return {
            "id": self._lease_id(partition),
            "group": self.group,
            "kind": "lease",
            "partition": partition,
            "owner": owner,
            "expires_at": format_time(expires_at),
            "acquired_at": format_time(now),  # acquired, never renewed, by acquire()
            "timestamp": format_time(utcnow()),
        }

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        item_id = self._lease_id(partition)
        body = self._lease(partition, owner, now, expires_at)
        with translated():
            current = read_or_none(self.container, item_id)
            if current is None:
                try:
                    self.container.create_item(body)
                except cosmos_errors.CosmosHttpResponseError as race:
                    if refusal(race) is not Refusal.EXISTS:
                        raise
                    return False  # another instance created it first
                return True
            expires = _expiry(current.get("expires_at")) or _FREE
            if current.get("owner") not in (owner, None) and expires >= now:
                return False  # held by someone else
            try:
                self.container.replace_item(
                    item_id,
                    body,
                    etag=current["_etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is None:
                    raise
                return False  # renewed or taken meanwhile
        return True

    def _patch_if_owner(self, partition: int, owner: str, fields: dict[str, Any]) -> None:
        item_id = self._lease_id(partition)
        ops = [{"op": "set", "path": f"/{k}", "value": v} for k, v in fields.items()]
        with translated():
            try:
                self.container.patch_item(
                    item_id,
                    partition_key=item_id,
                    patch_operations=ops,
                    filter_predicate=f"FROM c WHERE c.owner = {literal(owner)}",
                )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is None:
                    raise  # 404/412: not (or no longer) ours

    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        """One guarded patch per lease (see :meth:`GroupItems._renew_each`)."""
        self._renew_each(partitions, owner, expires_at, self._patch_if_owner)

    def release(self, partition: int, owner: str) -> None:
        self._patch_if_owner(partition, owner, {"owner": None, "expires_at": format_time(_FREE)})


class CosmosDeadLetters:
    def __init__(self, container: Any) -> None:
        self.container = container

    def put(
        self, aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
    ) -> None:
        body = dead_letter_item(aggregate_id, entry, error, attempts)
        with translated(aggregate_id):
            try:
                self.container.create_item(body)
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.EXISTS:
                    raise  # a 409 means already quarantined

    def refers_to(self, payload_id: str) -> bool:
        """Whether a dead letter holds a claim-checked entry with that payload."""
        with translated():
            counts = list(
                self.container.query_items(
                    CLAIMED,
                    parameters=[{"name": "@id", "value": payload_id}],
                    enable_cross_partition_query=True,
                )
            )
        return bool(counts and counts[0])


class AsyncCosmosDeadLetters:
    """The async twin of :class:`CosmosDeadLetters`."""

    def __init__(self, container: Any) -> None:
        self.container = container

    async def put(
        self, aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
    ) -> None:
        body = dead_letter_item(aggregate_id, entry, error, attempts)
        with translated(aggregate_id):
            try:
                await self.container.create_item(body)
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is not Refusal.EXISTS:
                    raise  # a 409 means already quarantined

    async def refers_to(self, payload_id: str) -> bool:
        with translated():
            pages = self.container.query_items(
                CLAIMED, parameters=[{"name": "@id", "value": payload_id}]
            )
            counts = [count async for count in pages]
        return bool(counts and counts[0])
