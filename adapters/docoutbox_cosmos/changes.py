"""The Cosmos DB change feed (latest-version mode, pull model) as a ChangeSource.

The feed is read per feed range with ``query_items_change_feed``; each range has its own
continuation. A position is ``{"v": 1, "ranges": {<feed range as JSON>: <continuation>}}``
and is stored as is by the checkpoints.

Rule kept (I5): an event's position may be saved only once the event and everything
before it is done, and a continuation only exists per *page*. So every event of a page
but the last carries the position from *before* the page, and the last carries the
position after it: resuming from a partly done page reads that page again (harmless,
publishing is at least once), never skips its tail.

A continuation the service or the SDK refuses, or a position whose ranges do not tile
the container's raise :class:`~docoutbox.errors.ChangeStreamLost`: the dispatcher then
sweeps and restarts from :meth:`start_marker`. A split is not a loss: the position keeps
the parent range, and the SDK moves its continuation to the children.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from docoutbox.dispatch.ports import ChangeEvent, Position
from docoutbox.errors import ChangeStreamLost
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


def opened_tokens(position: Position, current: Mapping[str, Any]) -> dict[str, str]:
    """The continuation per feed range of ``position``, checked against the ``current``
    ranges; :class:`~docoutbox.errors.ChangeStreamLost` when it cannot be resumed."""
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
    return dict(tokens)


def page_events(
    codec: ItemCodec, before: Position, after: Position, items: list[dict[str, Any]]
) -> list[ChangeEvent]:
    """The events of one page: all but the last at ``before``, the last at ``after``."""
    if not items:
        return []
    events = [ChangeEvent(before, codec.to_document(item)) for item in items[:-1]]
    events.append(ChangeEvent(after, codec.to_document(items[-1])))
    return events


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


class CosmosChangeSource:
    """Changes of one ``azure.cosmos`` container, over ``feed_ranges`` (default: all)."""

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

    def feed_ranges(self) -> dict[str, dict[str, Any]]:
        if self._ranges is None:
            with translated():
                ranges = list(self.container.read_feed_ranges())
        else:
            ranges = self._ranges
        return {range_key(r): r for r in ranges}

    def start_marker(self) -> Position:
        tokens: dict[str, str] = {}
        for key, feed_range in self.feed_ranges().items():
            hook = _LastHeaders()
            with translated_feed():
                pager = self.container.query_items_change_feed(
                    feed_range=feed_range, start_time="Now", response_hook=hook
                )
                for _ in pager.by_page():
                    break  # "Now" has nothing yet; a page here only moves the start later
            tokens[key] = hook.continuation()
        return {"v": 1, "ranges": tokens}

    def open(self, position: Position) -> None:
        self._tokens = opened_tokens(position, self.feed_ranges())
        self._next = 0

    def _position(self) -> Position:
        assert self._tokens is not None
        return {"v": 1, "ranges": dict(self._tokens)}

    def poll(self, max_events: int) -> list[ChangeEvent]:
        if self._tokens is None:
            raise ChangeStreamLost("the change feed is not open")
        events: list[ChangeEvent] = []
        keys = sorted(self._tokens)
        for step in range(len(keys)):
            if len(events) >= max_events:
                break
            key = keys[(self._next + step) % len(keys)]
            events.extend(self._read_page(key, max_events - len(events)))
        self._next = (self._next + 1) % len(keys)
        return events

    def _read_page(self, key: str, limit: int) -> list[ChangeEvent]:
        assert self._tokens is not None
        hook = _LastHeaders()
        before = self._position()
        with translated_feed():
            try:
                pager = self.container.query_items_change_feed(
                    continuation=self._tokens[key], max_item_count=limit, response_hook=hook
                )
                items: list[dict[str, Any]] = []
                for page in pager.by_page():
                    items = list(page)
                    break
            except (ValueError, KeyError, TypeError) as exc:  # the SDK parses the token
                raise ChangeStreamLost(f"unusable change feed continuation: {exc!r}") from exc
        self._tokens[key] = hook.continuation()
        return page_events(self.codec, before, self._position(), items)

    def close(self) -> None:
        self._tokens = None
