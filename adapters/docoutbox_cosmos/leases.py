"""Feed-range leases: which dispatcher instance reads which part of a container's change
feed, and from which continuation, as Cosmos DB's change feed processor does it.

Rule kept: only the holder of a lease writes it, and it proves it holds it with the ETag
it last read or wrote (``if-match``). A lease taken over by another instance changes
its ETag, so the old holder's next renewal or checkpoint gets 412 and it stops reading
and checkpointing that range (it also finds the lease gone at its next heartbeat).

Items of one lease ``group`` in the lease container (partitioned on ``/id``):

- ``{id: "<group>/ranges", kind: "ranges", ranges: [feed range, ...]}``: the feed ranges
  leased, fixed when the group is first used, in EPK order. Partition ``i`` of the
  :class:`~docoutbox.ports.dispatch.LeaseTable` port is ``ranges[i]``. A later split of
  the container changes nothing here: a feed range is a span of effective partition
  keys, which the SDK reads across the children of a split range.
- ``{id: "<group>/range/<i>", kind: "lease", partition: i, range, owner, expires_at,
  acquired_at, timestamp, continuation}``: one lease per feed range. ``continuation`` is where the
  range's change feed resumes (the checkpoint, advanced only past completed events, I5);
  a lease gets one at its first acquisition ("now": the acquiring dispatcher sweeps the
  range). A lease acquired with a continuation needs no sweep (:meth:`resumes`): the
  new owner's feed starts where the previous ones finished their work.
- ``{id: "<group>/member/<owner>", kind: "member", owner, expires_at, joined_at}``: live
  instances, for the fair share (:func:`docoutbox.dispatch.engine.leases.plan_leases`).

:class:`CosmosFeedRangeLeases` is the lease table (planned and heartbeated by the core's
:class:`~docoutbox.dispatch.drivers.ownership.LeaseKeeper`), the dispatcher's
:class:`~docoutbox.ports.dispatch.Checkpoints` (continuations go into the leases held),
and the ``locate`` that maps a document to its range. :class:`LeasedChangeSource` reads
the change feed of the ranges held, each from its lease's continuation.

Rule kept for that continuation (so that skipping the sweep loses nothing): it is written
only while the holder says the range is checkpointable (usable without a break since it
was acquired: see :meth:`~docoutbox.dispatch.drivers.ownership.LeaseKeeper.checkpointable`), only
from positions read under the current acquisition (each acquisition is a new *holding*,
recorded in the positions :class:`LeasedChangeSource` makes), and never again in a
holding whose feed restarted from now (its events were left to a sweep).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.errors import ChangeStreamLost, PermanentStoreError, StoreError
from docoutbox.ports.dispatch import ChangeEvent, LeaseView, Position
from docoutbox.store.document import ID, Document, utcnow
from docoutbox_cosmos.changes import CosmosChangeSource, now_token, range_key
from docoutbox_cosmos.coordination import _FREE, GroupItems, _expiry, read_or_none
from docoutbox_cosmos.errors import Refusal, refusal, translated
from docoutbox_cosmos.items import ItemCodec, encode_id, format_time

log = logging.getLogger("docoutbox.leases")

#: How many partition keys' feed ranges :meth:`CosmosFeedRangeLeases.locate` remembers.
#: The dispatcher locates a document right after the poll or sweep page that brought it
#: (at most ``batch_size`` or ``sweep_page`` documents), so a few polls' worth is enough; a
#: key forgotten is hashed again. Not one per aggregate of the backlog: memory stays flat.
LOCATED_MEMORY = 8_192


def _start(feed_range: Mapping[str, Any]) -> str:
    bounds = feed_range.get("Range")
    return str(bounds.get("min", "")) if isinstance(bounds, Mapping) else ""


class CosmosFeedRangeLeases(GroupItems):
    """The feed-range leases of one ``group`` over the ``monitored`` container.

    ``leases`` is the lease container (partitioned on ``/id``); ``codec`` maps aggregate
    IDs to partition-key values as the store does (default: the encoded ID).
    """

    def __init__(
        self,
        leases: Any,
        monitored: Any,
        group: str,
        *,
        codec: ItemCodec | None = None,
    ) -> None:
        super().__init__(leases, group)
        self.monitored = monitored
        self.codec = codec or ItemCodec()
        self._ranges: list[dict[str, Any]] | None = None
        self._keys: list[str] = []
        #: Leases this table holds: partition -> (owner, ETag of its last read or write).
        self._held: dict[int, tuple[str, str]] = {}
        #: Continuations read with the leases held (where their feeds resume).
        self._continuations: dict[int, str] = {}
        #: The continuation last written per partition (unchanged ones are not rewritten).
        self._written: dict[int, str] = {}
        self._locks: dict[int, threading.Lock] = {}
        #: The current holding (acquisition) of each partition held, and a counter.
        self._holdings: dict[int, int] = {}
        self._acquisitions = 0
        #: Held partitions acquired with a stored continuation (no sweep needed).
        self._resumable: set[int] = set()
        #: Held partitions whose continuation is not written again in this holding.
        self._spoiled: set[int] = set()
        self._checkpointable: Callable[[int], bool] | None = None
        self._usable: Callable[[int], bool] | None = None
        self._located: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    # -- the ranges -------------------------------------------------------------------

    def ranges(self) -> list[dict[str, Any]]:
        """The group's feed ranges, fixed at its first use (created then, if missing)."""
        if self._ranges is None:
            item_id = encode_id(f"{self.group}/ranges")
            with translated():
                try:
                    item = self.container.read_item(item_id, partition_key=item_id)
                except cosmos_errors.CosmosHttpResponseError as exc:
                    if refusal(exc) is not Refusal.MISSING:
                        raise
                    current = sorted(self.monitored.read_feed_ranges(), key=_start)
                    body = {"id": item_id, "group": self.group, "kind": "ranges", "ranges": current}
                    try:
                        item = self.container.create_item(body)
                    except cosmos_errors.CosmosHttpResponseError as race:
                        if refusal(race) is not Refusal.EXISTS:
                            raise
                        item = self.container.read_item(item_id, partition_key=item_id)
            ranges = item.get("ranges")
            if not isinstance(ranges, list) or not ranges:
                raise PermanentStoreError(f"lease group {self.group!r}: malformed ranges item")
            self._keys = [range_key(r) for r in ranges]
            self._ranges = ranges
        return self._ranges

    def _lock_of(self, partition: int) -> threading.Lock:
        """The lock serializing this table's writes to one lease (so each carries the
        ETag of the previous one)."""
        with self._lock:
            return self._locks.setdefault(partition, threading.Lock())

    @property
    def partitions(self) -> int:
        """How many leases the group has (one per feed range)."""
        return len(self.ranges())

    def range_keys(self) -> list[str]:
        """The feed ranges as position keys (:func:`~docoutbox_cosmos.changes.range_key`)."""
        self.ranges()
        return self._keys

    def locate(self, document: Document) -> int:
        """The partition (index of the feed range) ``document`` belongs to.

        Hashing a partition key costs the SDK about 150 µs, so the answers are kept, and
        :class:`LeasedChangeSource` records the range of every item its feeds deliver.
        """
        _, pk = self.codec.key(document[ID])
        with self._lock:
            known = self._located.get(pk)
        if known is not None:
            return known
        with translated():
            point = self.monitored.feed_range_from_partition_key(pk)
            for i, feed_range in enumerate(self.ranges()):
                if self.monitored.is_feed_range_subset(feed_range, point):
                    self.remember(pk, i)
                    return i
        raise StoreError(f"no leased feed range holds partition key {pk!r}")

    def remember(self, pk: str, partition: int) -> None:
        """Record that partition key ``pk`` is in the feed range ``partition``."""
        with self._lock:
            self._located[pk] = partition
            self._located.move_to_end(pk)
            while len(self._located) > LOCATED_MEMORY:
                self._located.popitem(last=False)

    # -- the LeaseTable port ----------------------------------------------------------

    def _lease_id(self, partition: int) -> str:
        return encode_id(f"{self.group}/range/{partition}")

    def read(self) -> LeaseView:
        leases, members = self._read_group()
        now = utcnow()
        with self._lock:
            for p, (owner, _) in list(self._held.items()):
                holder, expires = leases.get(p, ("", _FREE))
                if holder != owner or expires <= now:
                    self._forget(p)  # taken over, gone or lapsed: not read, not written
        return LeaseView(leases, members)

    def acquire(self, partition: int, owner: str, now: datetime, expires_at: datetime) -> bool:
        """Take the lease if free, expired at ``now`` or ``owner``'s: created (a race loser
        gets 409) or replaced under the ETag read (a race loser gets 412)."""
        ranges = self.ranges()
        if not 0 <= partition < len(ranges):
            return False
        item_id = self._lease_id(partition)
        with self._lock_of(partition), translated():
            current = read_or_none(self.container, item_id)
            if current is not None:
                expires = _expiry(current.get("expires_at")) or _FREE
                if current.get("owner") not in (owner, None) and expires >= now:
                    return False  # held by someone else
            continuation = None if current is None else current.get("continuation")
            stored = isinstance(continuation, str) and bool(continuation)
            if not isinstance(continuation, str) or not continuation:
                continuation = now_token(self.monitored, ranges[partition])
            body = {
                "id": item_id,
                "group": self.group,
                "kind": "lease",
                "partition": partition,
                "range": ranges[partition],
                "owner": owner,
                "expires_at": format_time(expires_at),
                "acquired_at": format_time(now),
                "timestamp": format_time(utcnow()),
                "continuation": continuation,
            }
            try:
                if current is None:
                    written = self.container.create_item(body)
                else:
                    written = self.container.replace_item(
                        item_id,
                        body,
                        etag=current["_etag"],
                        match_condition=MatchConditions.IfNotModified,
                    )
            except cosmos_errors.CosmosHttpResponseError as exc:
                if refusal(exc) is None:
                    raise
                return False  # created, renewed or taken meanwhile
        with self._lock:
            self._held[partition] = (owner, written["_etag"])
            self._continuations[partition] = continuation
            self._written[partition] = continuation
            self._acquisitions += 1
            self._holdings[partition] = self._acquisitions
            self._spoiled.discard(partition)
            if stored:
                self._resumable.add(partition)
            else:
                self._resumable.discard(partition)
        return True

    def resumes(self, partition: int) -> bool:
        """Whether ``partition`` was acquired with a stored continuation: its feed resumes
        where the previous holders' work ended, so it needs no sweep."""
        with self._lock:
            return partition in self._resumable

    def leased_ports(self) -> tuple[LeasedChangeSource, CosmosFeedRangeLeases]:
        """The change feed of the ranges held, each from the continuation in its lease,
        and this table as the checkpoints that keep them (a
        :class:`~docoutbox.ports.dispatch.StreamLeases`)."""
        return LeasedChangeSource(self.monitored, self), self

    def guard_checkpoints(
        self, checkpointable: Callable[[int], bool], usable: Callable[[int], bool]
    ) -> None:
        """Write a range's continuation only while ``checkpointable(partition)`` (the
        holder's :meth:`~docoutbox.dispatch.drivers.ownership.LeaseKeeper.checkpointable`); read a
        range acquired only once ``usable(partition)`` (the holder works in it)."""
        self._checkpointable = checkpointable
        self._usable = usable

    def ready(self, partition: int) -> bool:
        """Whether the holder uses ``partition`` yet (its feed is read from then on: an
        event read before the holder knew of its acquisition would be passed over)."""
        usable = self._usable
        return usable is None or usable(partition)

    def spoil(self, partition: int) -> None:
        """Write no continuation of ``partition`` again in this holding (its feed restarted
        from now, leaving events to a sweep): the next owner resumes from the older one."""
        with self._lock:
            self._spoiled.add(partition)

    def holdings(self) -> dict[int, int]:
        """The current holding (a number that changes at each acquisition) per partition."""
        with self._lock:
            return dict(self._holdings)

    def _write_if_held(self, partition: int, owner: str, fields: dict[str, Any]) -> bool:
        """Patch the lease under the ETag this table holds it with; False (and forgotten)
        once another instance took it. A 412 on a lease still ``owner``'s (a write of
        ours whose reply was lost) adopts the new ETag and tries once more."""
        item_id = self._lease_id(partition)
        ops = [{"op": "set", "path": f"/{k}", "value": v} for k, v in fields.items()]
        with self._lock_of(partition), translated():
            for _ in range(2):
                with self._lock:
                    held = self._held.get(partition)
                if held is None or held[0] != owner:
                    return False
                try:
                    written = self.container.patch_item(
                        item_id,
                        partition_key=item_id,
                        patch_operations=ops,
                        etag=held[1],
                        match_condition=MatchConditions.IfNotModified,
                    )
                except cosmos_errors.CosmosHttpResponseError as exc:
                    kind = refusal(exc)
                    if kind is None:
                        raise
                    current = None
                    if kind is Refusal.STALE:
                        current = read_or_none(self.container, item_id)
                    with self._lock:
                        if current is not None and current.get("owner") == owner:
                            self._held[partition] = (owner, current["_etag"])
                            continue
                        self._forget(partition)
                    log.warning("lease_taken_over group=%s partition=%d", self.group, partition)
                    return False
                with self._lock:
                    self._held[partition] = (owner, written["_etag"])
                return True
        return False

    def renew(self, partitions: Collection[int], owner: str, expires_at: datetime) -> None:
        """One ETag-conditioned write per lease (see :meth:`GroupItems._renew_each`)."""
        self._renew_each(partitions, owner, expires_at, self._write_if_held)

    def release(self, partition: int, owner: str) -> None:
        fields = {"owner": None, "expires_at": format_time(_FREE)}
        fields["timestamp"] = format_time(utcnow())
        if self._write_if_held(partition, owner, fields):
            with self._lock:
                self._forget(partition)

    def _forget(self, partition: int) -> None:
        self._held.pop(partition, None)
        self._continuations.pop(partition, None)
        self._written.pop(partition, None)
        self._holdings.pop(partition, None)
        self._resumable.discard(partition)
        self._spoiled.discard(partition)

    def held(self) -> dict[int, str]:
        """The partitions this table holds, with the continuation each resumes from."""
        with self._lock:
            return {p: self._continuations[p] for p in self._held if p in self._continuations}

    # -- the Checkpoints port: continuations live in the leases -------------------------

    def load(self, name: str) -> Position | None:
        """Each range resumes from its own lease: the stream opens with no tokens of its
        own (:class:`LeasedChangeSource` takes them from the leases held)."""
        return {"v": 1, "ranges": {}}

    def save(self, name: str, position: Position) -> None:
        """Write each held range's continuation into its lease (under its ETag), when it
        was read under the current holding and the holder says it may (module docstring)."""
        tokens = position.get("ranges") if isinstance(position, Mapping) else None
        if not isinstance(tokens, Mapping):
            return
        holdings = position.get("holdings")
        index = {key: i for i, key in enumerate(self.range_keys())}
        for key, token in tokens.items():
            partition = index.get(key)
            if partition is None or not isinstance(token, str):
                continue
            with self._lock:
                held = self._held.get(partition)
                if held is None or self._written.get(partition) == token:
                    continue
                if partition in self._spoiled:
                    continue
                if isinstance(holdings, Mapping) and (
                    holdings.get(key) != self._holdings.get(partition)
                ):
                    continue  # read under an earlier holding of this range
            if self._checkpointable is not None and not self._checkpointable(partition):
                continue
            fields = {"continuation": token, "timestamp": format_time(utcnow())}
            if self._write_if_held(partition, held[0], fields):
                with self._lock:
                    self._written[partition] = token


class LeasedChangeSource(CosmosChangeSource):
    """The change feed of the feed ranges ``leases`` holds, each from its lease's
    continuation; ranges join as they are acquired and leave as they are lost.

    A range whose continuation is refused (a bad token, a range gone: 400/410) restarts
    from now and is reported as :class:`~docoutbox.errors.ChangeStreamLost` for that
    partition only, after the events read before it in the same poll are handed over.
    """

    def __init__(
        self, container: Any, leases: CosmosFeedRangeLeases, *, codec: ItemCodec | None = None
    ) -> None:
        super().__init__(container, codec=codec or leases.codec)
        self.leases = leases
        self._lost: set[int] = set()
        #: The holding each range's token was read under (see CosmosFeedRangeLeases).
        self._holding: dict[str, int] = {}

    def feed_ranges(self) -> dict[str, dict[str, Any]]:
        return {range_key(r): r for r in self.leases.ranges()}

    def start_marker(self) -> Position:
        ranges = self.leases.ranges()
        holdings = self.leases.holdings()
        held = sorted(self.leases.held())
        return {
            "v": 1,
            "ranges": {range_key(ranges[p]): now_token(self.container, ranges[p]) for p in held},
            "holdings": {range_key(ranges[p]): holdings.get(p) for p in held},
        }

    def _position(self) -> Position:
        position = super()._position()
        position["holdings"] = {key: self._holding.get(key) for key in position["ranges"]}
        return position

    def open(self, position: Position) -> None:
        tokens = position.get("ranges") if isinstance(position, Mapping) else None
        if (
            not isinstance(position, Mapping)
            or position.get("v") != 1
            or not isinstance(tokens, Mapping)
            or not all(isinstance(k, str) and isinstance(t, str) for k, t in tokens.items())
        ):
            raise ChangeStreamLost(f"not a Cosmos change feed position: {position!r}")
        if not set(tokens) <= set(self.leases.range_keys()):
            raise ChangeStreamLost("the position names feed ranges this lease group has not")
        self._tokens = dict(tokens)
        self._next = 0
        holdings = position.get("holdings")
        if isinstance(holdings, Mapping):
            self._holding = {k: h for k, h in holdings.items() if isinstance(h, int)}
        else:  # tokens of the ranges as held now
            current, keys = self.leases.holdings(), self.leases.range_keys()
            self._holding = {keys[p]: h for p, h in current.items() if keys[p] in tokens}

    def _follow_leases(self) -> None:
        """Drop the ranges no longer held, add those acquired (from their continuation)
        once their holder uses them: a range acquired again since its token was read
        restarts from its lease's."""
        assert self._tokens is not None
        keys = self.leases.range_keys()
        held = self.leases.held()
        holdings = self.leases.holdings()
        wanted = {keys[p]: p for p in held}
        for key in list(self._tokens):
            if key not in wanted:
                del self._tokens[key]
                self._holding.pop(key, None)
        for key, p in wanted.items():
            if key in self._tokens and self._holding.get(key) == holdings.get(p):
                continue
            self._tokens.pop(key, None)
            if self.leases.ready(p):
                self._tokens[key] = held[p]
                self._holding[key] = holdings.get(p, 0)

    def poll(self, max_events: int) -> list[ChangeEvent]:
        if self._tokens is None:
            raise ChangeStreamLost("the change feed is not open")
        if self._lost:
            lost, self._lost = self._lost, set()
            raise ChangeStreamLost("feed ranges restarted from now", partitions=lost)
        self._follow_leases()
        events: list[ChangeEvent] = []
        for key in self._order():
            if len(events) >= max_events:
                break
            try:
                events.extend(self._read_page(key, max_events - len(events)))
            except ChangeStreamLost as exc:
                self._restart(key, exc)
                break
        if self._lost and not events:
            return self.poll(max_events)  # raises for the lost ranges
        return events

    def _page(self, key: str, token: str, before: Position, items: list[Any]) -> list[ChangeEvent]:
        events = super()._page(key, token, before, items)
        partition = self.leases.range_keys().index(key)
        for event in events:
            if event.document is not None:
                self.leases.remember(self.codec.key(event.document[ID])[1], partition)
        return events

    def _restart(self, key: str, exc: ChangeStreamLost) -> None:
        assert self._tokens is not None
        partition = self.leases.range_keys().index(key)
        log.warning("feed_range_lost partition=%d error=%r; restarting it from now", partition, exc)
        self._tokens[key] = now_token(self.container, self.feed_ranges()[key])
        self.leases.spoil(partition)  # its lease keeps the older continuation
        self._lost.add(partition)
