"""The Cosmos DB change feed (latest-version mode, pull model) as a ChangeSource, sync
(:class:`CosmosChangeSource`) and ``azure.cosmos.aio`` (:class:`AsyncCosmosChangeSource`),
sharing everything but the requests. The feed of the ranges whose leases an instance holds
is :class:`docoutbox_cosmos.leases.LeasedChangeSource`.

The feed is read per feed range with ``query_items_change_feed``; each range has its own
continuation. A position is ``{"v": 1, "ranges": {<feed range as JSON>: <continuation>}}``
and is stored as is by the checkpoints.

Rule kept (I5): an event's position may be saved only once the event and everything
before it is done, and a continuation only exists per *page*. So every event of a page
but the last carries the position from *before* the page, and the last carries the
position after it: resuming from a partly done page reads that page again (harmless,
publishing is at least once), never skips its tail.

Events are ``current``: in latest-version mode the feed delivers each item once, as it
is at the time of the read (a later change of the item comes again, later in the feed),
like MongoDB's ``updateLookup``. The dispatcher publishes from that copy and aims its
trim at the positions it shows, without reading the item again; the copy's ``_etag``
comes along under :data:`~docoutbox.store.document.REVISION` for that trim's if-match.

A poll holds at most one page per feed range and at most ``max_events`` items in all
(``max_item_count``), never the whole backlog.

A continuation the service or the SDK refuses, or a position whose ranges do not tile
the container's raise :class:`~docoutbox.errors.ChangeStreamLost`: the dispatcher then
sweeps and restarts from :meth:`start_marker`. A split is not a loss: the position keeps
the parent range, and the SDK moves its continuation to the children.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping
from itertools import pairwise
from typing import Any

from docoutbox.errors import ChangeStreamLost
from docoutbox.ports.dispatch import ChangeEvent, Position
from docoutbox.store.document import REVISION, Document
from docoutbox_cosmos.errors import translated, translated_feed
from docoutbox_cosmos.items import ItemCodec


def range_key(feed_range: Mapping[str, Any]) -> str:
    return json.dumps(feed_range, sort_keys=True, separators=(",", ":"))


def _span(key: str) -> tuple[str, str]:
    feed_range = json.loads(key)
    bounds = feed_range["Range"]
    return str(bounds["min"]), str(bounds["max"])


def _covers(tokens: Mapping[str, str], current: Mapping[str, Any]) -> bool:
    """Whether the ranges of a position tile exactly the span of the ``current`` ranges.

    After a split the position still names the parent range, whose continuation the SDK
    moves to the children: the position stays usable. Ranges of another container, or a
    key that is not a feed range, do not tile it.
    """
    try:
        saved = sorted(_span(key) for key in tokens)
        spans = sorted(_span(key) for key in current)
    except (ValueError, KeyError, TypeError):
        return False
    if not saved or not spans or saved[0][0] != spans[0][0] or saved[-1][1] != spans[-1][1]:
        return False
    return all(a[1] == b[0] for a, b in pairwise(saved))


class _LastHeaders:
    """A ``response_hook`` keeping the newest response headers of one pager.

    The SDK rewrites the ``etag`` of those headers into its composite continuation after
    the hook runs, so this is where the continuation is read, even when no page came
    (and without touching the client's shared ``last_response_headers``).
    """

    def __init__(self) -> None:
        self.headers: Mapping[str, Any] | None = None

    def __call__(self, headers: Mapping[str, Any], _result: object) -> None:
        self.headers = headers

    def continuation(self) -> str:
        token = None if self.headers is None else self.headers.get("etag")
        if not isinstance(token, str) or not token:
            raise ChangeStreamLost("the change feed answered without a continuation")
        return token


def now_token(container: Any, feed_range: Mapping[str, Any]) -> str:
    """A continuation of ``feed_range`` from now: changes committed after the call follow it."""
    hook = _LastHeaders()
    with translated_feed():
        pager = container.query_items_change_feed(
            feed_range=feed_range, start_time="Now", response_hook=hook
        )
        for _ in pager.by_page():
            break  # "Now" has nothing yet; a page here only moves the start later
    return hook.continuation()


async def now_token_async(container: Any, feed_range: Mapping[str, Any]) -> str:
    """The async twin of :func:`now_token`."""
    hook = _LastHeaders()
    with translated_feed():
        pager = container.query_items_change_feed(
            feed_range=feed_range, start_time="Now", response_hook=hook
        )
        async for _ in pager.by_page():
            break
    return hook.continuation()


def _unusable(exc: Exception) -> ChangeStreamLost:
    return ChangeStreamLost(f"unusable change feed continuation: {exc!r}")


class _FeedReader:
    """What the sync and async sources share: the tokens per feed range, the checks of
    a position, the order ranges are read in, and the events of a page (see the module
    docstring for their positions). The subclasses only send the requests."""

    def __init__(
        self,
        container: Any,
        *,
        codec: ItemCodec | None = None,
        feed_ranges: list[dict[str, Any]] | None = None,
    ) -> None:
        self.container = container
        self.codec = codec or ItemCodec()
        self._ranges = feed_ranges
        self._tokens: dict[str, str] | None = None
        self._next = 0

    def _accept(self, position: Position, current: Mapping[str, Any]) -> None:
        tokens = position.get("ranges") if isinstance(position, Mapping) else None
        if (
            not isinstance(position, Mapping)
            or position.get("v") != 1
            or not isinstance(tokens, Mapping)
            or not all(isinstance(k, str) and isinstance(t, str) for k, t in tokens.items())
        ):
            raise ChangeStreamLost(f"not a Cosmos change feed position: {position!r}")
        if not _covers(tokens, current):
            raise ChangeStreamLost("the checkpoint's feed ranges do not cover the container's")
        self._tokens = dict(tokens)
        self._next = 0

    def _position(self) -> Position:
        assert self._tokens is not None
        return {"v": 1, "ranges": dict(self._tokens)}

    def _order(self) -> list[str]:
        """The ranges to read in this poll, round robin from a different one each time."""
        if self._tokens is None:
            raise ChangeStreamLost("the change feed is not open")
        keys = sorted(self._tokens)
        start = self._next % max(1, len(keys))
        self._next = start + 1
        return keys[start:] + keys[:start]

    def _page(self, key: str, token: str, before: Position, items: list[Any]) -> list[ChangeEvent]:
        assert self._tokens is not None
        self._tokens[key] = token
        if not items:
            return []
        after = self._position()
        # Latest-version mode: each item is the document as it was when read, so the
        # dispatcher publishes from it without a reload. The SDK's pager keeps the page's
        # items until the cyclic garbage collector frees it (it refers to itself), which
        # may be many pages later: each item is emptied once its document is made, so
        # what the engine lets go is freed at once and memory stays flat.
        docs: list[Document] = []
        for item in items:
            docs.append(self._document(item))
            if isinstance(item, dict):
                item.clear()
        events = [ChangeEvent(before, doc, current=True, lane=key) for doc in docs[:-1]]
        events.append(ChangeEvent(after, docs[-1], current=True, lane=key))
        return events

    @staticmethod
    def merge_positions(latest: Position, held: Mapping[Hashable, Position]) -> Position:
        """``latest``, with each feed range in ``held`` (a lane: see
        :class:`~docoutbox.ports.dispatch.ChangeEvent`) at the continuation, and holding,
        that ``held`` gives for it. A range whose held position does not name it is left
        out: its continuation is not saved this time."""
        ranges = dict(latest["ranges"])
        merged = {**latest, "ranges": ranges}
        holdings = latest.get("holdings")
        if isinstance(holdings, Mapping):
            holdings = merged["holdings"] = dict(holdings)
        for key, position in held.items():
            if not isinstance(key, str):
                continue  # not a feed range of this source's
            tokens = position.get("ranges") if isinstance(position, Mapping) else None
            token = tokens.get(key) if isinstance(tokens, Mapping) else None
            if token is None:
                ranges.pop(key, None)
                if isinstance(holdings, dict):
                    holdings.pop(key, None)
                continue
            ranges[key] = token
            if isinstance(holdings, dict):
                holdings[key] = (position.get("holdings") or {}).get(key)
        return merged

    def _document(self, item: dict[str, Any]) -> Document:
        doc = self.codec.to_document(item)
        etag = item.get("_etag")
        if isinstance(etag, str) and etag:
            doc[REVISION] = etag  # lets a trim aim at this copy's positions with if-match
        return doc

    def _page_request(self, key: str, limit: int, hook: _LastHeaders) -> Any:
        assert self._tokens is not None
        return self.container.query_items_change_feed(
            continuation=self._tokens[key], max_item_count=limit, response_hook=hook
        )


class CosmosChangeSource(_FeedReader):
    """Changes of one ``azure.cosmos`` container, over ``feed_ranges`` (default: all)."""

    def feed_ranges(self) -> dict[str, dict[str, Any]]:
        if self._ranges is None:
            with translated():
                ranges = list(self.container.read_feed_ranges())
        else:
            ranges = self._ranges
        return {range_key(r): r for r in ranges}

    def start_marker(self) -> Position:
        tokens = {key: now_token(self.container, r) for key, r in self.feed_ranges().items()}
        return {"v": 1, "ranges": tokens}

    def open(self, position: Position) -> None:
        self._accept(position, self.feed_ranges())

    def poll(self, max_events: int) -> list[ChangeEvent]:
        events: list[ChangeEvent] = []
        for key in self._order():
            if len(events) >= max_events:
                break
            events.extend(self._read_page(key, max_events - len(events)))
        return events

    def _read_page(self, key: str, limit: int) -> list[ChangeEvent]:
        hook, before = _LastHeaders(), self._position()
        items: list[Any] = []
        with translated_feed():
            try:
                for page in self._page_request(key, limit, hook).by_page():
                    items = list(page)
                    del page  # its iterator holds the page's items too
                    break
            except (ValueError, KeyError, TypeError) as exc:  # the SDK parses the token
                raise _unusable(exc) from exc
        return self._page(key, hook.continuation(), before, items)

    def close(self) -> None:
        self._tokens = None


class AsyncCosmosChangeSource(_FeedReader):
    """The async twin of :class:`CosmosChangeSource`, over an ``azure.cosmos.aio``
    container."""

    async def feed_ranges(self) -> dict[str, dict[str, Any]]:
        if self._ranges is None:
            with translated():
                ranges = [r async for r in self.container.read_feed_ranges()]
        else:
            ranges = self._ranges
        return {range_key(r): r for r in ranges}

    async def start_marker(self) -> Position:
        ranges = await self.feed_ranges()
        return {
            "v": 1,
            "ranges": {key: await now_token_async(self.container, r) for key, r in ranges.items()},
        }

    async def open(self, position: Position) -> None:
        self._accept(position, await self.feed_ranges())

    async def poll(self, max_events: int) -> list[ChangeEvent]:
        events: list[ChangeEvent] = []
        for key in self._order():
            if len(events) >= max_events:
                break
            events.extend(await self._read_page(key, max_events - len(events)))
        return events

    async def _read_page(self, key: str, limit: int) -> list[ChangeEvent]:
        hook, before = _LastHeaders(), self._position()
        items: list[Any] = []
        with translated_feed():
            try:
                async for page in self._page_request(key, limit, hook).by_page():
                    items = [item async for item in page]
                    del page  # its iterator holds the page's items too
                    break
            except (ValueError, KeyError, TypeError) as exc:  # the SDK parses the token
                raise _unusable(exc) from exc
        return self._page(key, hook.continuation(), before, items)

    async def close(self) -> None:
        self._tokens = None
