"""The contestants of :mod:`benchmarks.cosmos_dispatch` and their meters: a change-feed
dispatcher written by hand with azure-cosmos, and two benchmark-only backends for the
threaded Dispatcher (trims not sent: its publish-only ceiling; trims held and coalesced per
aggregate: an emulation of deferred trims, not crash-safe).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.model import OutboxMessage
from docoutbox.store.plans import TrimPlan, WritePlan
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.items import MAX_PATCH_OPS, parse_time


class KindMeter:
    """Responses and their request charge per kind of request, thread-safely."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.charge = 0.0
        self._lock = threading.Lock()

    def count(self, kind: str, charge: float) -> None:
        with self._lock:
            self.requests[kind] += 1
            self.charge += charge

    def on_charge(self, kind: str, status: int, charge: float) -> None:
        """A :class:`~docoutbox_cosmos.backend.CosmosBackend` ``on_charge`` hook; refused
        requests (412: the guard failed) also count as ``<kind> 412``."""
        self.count(kind, charge)
        if status == 412:
            with self._lock:
                self.requests[f"{kind} 412"] += 1

    def raw_hook(self, kind: str) -> Callable[[Any], None]:
        """A ``raw_response_hook`` counting ``kind``."""

        def hook(response: Any) -> None:
            self.count(kind, _charge(response.http_response.headers))

        return hook

    def total(self) -> int:
        with self._lock:
            return sum(n for kind, n in self.requests.items() if not kind.endswith(" 412"))


def _charge(headers: Any) -> float:
    return float(headers.get("x-ms-request-charge") or 0.0)


class FeedMeter:
    """A container whose change-feed responses count as ``feed`` on a meter."""

    def __init__(self, container: Any, meter: KindMeter) -> None:
        self._container = container
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)

    def query_items_change_feed(self, **kwargs: Any) -> Any:
        hook = kwargs.get("response_hook")

        def counted(headers: Any, result: Any) -> None:
            self._meter.count("feed", _charge(headers))
            if hook is not None:
                hook(headers, result)

        return self._container.query_items_change_feed(**{**kwargs, "response_hook": counted})


class MemorySink:
    """Counts publishes and keeps each entry's delivery lag (publish time - created_at)."""

    def __init__(self) -> None:
        self.count = 0
        self.lags: list[float] = []
        self._lock = threading.Lock()

    def record(self, created_at: object) -> None:
        now = datetime.now(UTC)
        with self._lock:
            self.count += 1
            if isinstance(created_at, datetime):
                self.lags.append((now - created_at).total_seconds())

    def publish(self, entry: OutboxMessage) -> None:
        self.record(entry.created_at)


class PublishOnly(CosmosBackend):
    """A backend whose trims are not sent: the dispatcher's publish-only ceiling.

    The engine takes each trim as done, so it still leaves the entries out of later
    copies of the aggregate (they are not published twice); the outboxes only grow.
    """

    def write(self, plan: WritePlan) -> bool:
        if isinstance(plan, TrimPlan):
            return True
        return super().write(plan)


@dataclass
class _Held:
    """An aggregate's held trims: since when, the entry IDs, the stored order of its outbox
    as the copies showed it, and the newest copy's ETag while that copy shows them all."""

    since: float
    ids: dict[str, None] = field(default_factory=dict)
    order: dict[str | None, None] = field(default_factory=dict)
    revision: str | None = None


class DeferredTrims(CosmosBackend):
    """A backend that holds each aggregate's trims for ``delay`` seconds, or until they
    name 10 entries (what one patch removes), coalescing the trims that come meanwhile
    into one.

    Benchmark-only: it answers "trimmed" before trimming, so a crash would leave the held
    entries for a sweep to publish again. :meth:`flush` sends every held trim.

    The engine leaves the entries it takes as trimmed out of later copies, and out of their
    trims' position hints: the hint of a coalesced trim is the first copy's stored order
    with the entries later copies show appended (commits only append, and nothing else
    removes while a trim is held), so the trim needs no read.
    """

    def __init__(self, container: Any, *, delay: float, **options: Any) -> None:
        super().__init__(container, **options)
        self.delay = delay
        self._held: dict[Any, _Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def write(self, plan: WritePlan) -> bool:
        if not isinstance(plan, TrimPlan):
            return super().write(plan)
        with self._lock:
            held = self._held.setdefault(plan.aggregate_id, _Held(time.monotonic()))
            held.ids.update(dict.fromkeys(plan.entry_ids))
            if plan.outbox is None:
                held.order.clear()  # no hint: the trim reads the item
            else:
                held.order.update(dict.fromkeys(plan.outbox))
            shows_all = plan.outbox is not None and set(held.ids) <= set(plan.outbox)
            held.revision = plan.revision if shows_all else None
        return True

    def _due(self, everything: bool) -> list[TrimPlan]:
        now = time.monotonic()
        with self._lock:
            due = [
                k
                for k, h in self._held.items()
                if everything or now - h.since >= self.delay or len(h.ids) >= MAX_PATCH_OPS
            ]
            plans = []
            for key in due:
                held = self._held.pop(key)
                order = tuple(held.order) if held.order else None
                plans.append(TrimPlan(key, tuple(held.ids), order, held.revision))
        return plans

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            for plan in self._due(False):
                super().write(plan)

    def flush(self) -> None:
        self._stop.set()
        self._thread.join()
        for plan in self._due(True):
            super().write(plan)


def _keep(into: list[Any]) -> Callable[[Any, Any], None]:
    """A change-feed ``response_hook`` keeping each response's headers."""

    def hook(headers: Any, _result: Any) -> None:
        into.append(headers)

    return hook


class HandWrittenDispatcher:
    """A change-feed dispatcher as a user writes it with azure-cosmos alone.

    Per feed range: read one page from the continuation; for each item, publish the
    entries above the last ``seq`` published for its aggregate, then remove every entry
    published so far with patches of at most 10 removals, each if-match on the ``_etag``
    of the copy in hand (a 412 re-reads the item); then keep the page's continuation.
    """

    def __init__(
        self, container: Any, tokens: dict[str, str], sink: MemorySink, meter: KindMeter
    ) -> None:
        self.container = FeedMeter(container, meter)
        self.tokens = dict(tokens)
        self.sink = sink
        self.meter = meter
        self.published: dict[str, int] = {}

    def poll(self, page_size: int = 100) -> int:
        """One page of every feed range; the number of items read."""
        read = 0
        for key, token in list(self.tokens.items()):
            last: list[Any] = []  # the SDK puts the continuation in them after the hook
            pager = self.container.query_items_change_feed(
                continuation=token, max_item_count=page_size, response_hook=_keep(last)
            )
            items: list[dict[str, Any]] = []
            for page in pager.by_page():
                items = list(page)
                break
            for item in items:
                self._dispatch(item)
            read += len(items)
            self.tokens[key] = last[-1]["etag"]
        return read

    def _dispatch(self, item: dict[str, Any]) -> None:
        aggregate = item["id"]
        last = self.published.get(aggregate, 0)
        for entry in sorted(item.get("outbox") or [], key=lambda e: e["seq"]):
            if entry["seq"] > last:
                self.sink.record(parse_time(entry["created_at"]))
                last = entry["seq"]
        self.published[aggregate] = last
        fresh: dict[str, Any] | None = item
        while fresh is not None:
            fresh = self._trim(fresh, last)

    def _trim(self, item: dict[str, Any], last: int) -> dict[str, Any] | None:
        """Remove the entries up to ``last``; the item to try again from, or None."""
        indexes = [i for i, e in enumerate(item.get("outbox") or []) if e["seq"] <= last]
        etag = item["_etag"]
        try:
            while indexes:
                chunk, indexes = indexes[-MAX_PATCH_OPS:], indexes[:-MAX_PATCH_OPS]
                ops = [{"op": "remove", "path": f"/outbox/{i}"} for i in reversed(chunk)]
                written = self.container.patch_item(
                    item["id"],
                    partition_key=item["id"],
                    patch_operations=ops,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    raw_response_hook=self.meter.raw_hook("patch"),
                )
                etag = written["_etag"]
        except cosmos_errors.CosmosHttpResponseError as exc:
            if exc.status_code == 404:
                return None
            if exc.status_code != 412:
                raise
            fresh: dict[str, Any] = self.container.read_item(
                item["id"], partition_key=item["id"], raw_response_hook=self.meter.raw_hook("read")
            )
            return fresh
        return None
