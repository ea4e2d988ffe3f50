"""What this dispatcher trimmed lately, so that an older copy does not publish it again.

Rule: memory follows what is in flight, never the backlog. A run publishes from the copy
of the document that came with its request (an event's, a sweep page's); a copy read
before one of this instance's trims still shows the trimmed entries, and publishing them
again would be a duplicate (allowed by at-least-once delivery, but avoidable).
:class:`TrimmedIds` remembers the IDs each trim removed, per aggregate, and leaves them out
of later copies (:meth:`TrimmedIds.unpublished`).

Only a few aggregates can have such a copy: one in the engine's hands, in its read in
flight or in a batch the change source fetched and hands over in parts. A copy waits
behind at most that many other aggregates' runs, so keeping the aggregates trimmed most recently,
that many (:func:`aggregates_in_flight`), covers every copy that can still come.

Per aggregate, the IDs stay until the aggregate is among the least recently trimmed or
its own bound is reached: a copy that no longer shows an entry does not prove that no older
copy is still on its way (a change stream hands over batches fetched before a sweep page
that came meanwhile). A hard count bound holds whatever comes: at most ``aggregates``
aggregates, at most ``per_aggregate`` IDs each (the oldest go first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

from docoutbox.model import AggregateId
from docoutbox.store.document import ID, REVISION, Document

#: IDs remembered per aggregate at most: a copy showing more entries than that which this
#: instance trimmed since the copy was read may publish the oldest of them again.
PER_AGGREGATE = 1_000


class Sizes(Protocol):
    """The counts of a :class:`~docoutbox.dispatch.engine.loop.DispatcherConfig` that bound
    what is in flight."""

    @property
    def max_backlog(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def sweep_page(self) -> int: ...
    @property
    def concurrency(self) -> int: ...


def aggregates_in_flight(
    *, max_backlog: int, batch_size: int, sweep_page: int, concurrency: int
) -> int:
    """How many other aggregates' runs can trim between a trim and the run of a copy read
    before it.

    Copies come only from the engine's own reads, one at a time: a poll asks for at most
    ``min(batch_size, max_backlog)`` less the aggregates in hand, a sweep page (at most
    ``sweep_page``) is read only below ``max_backlog``. So the aggregates in hand when the
    trim happens plus those a read in flight brings stay under ``max_backlog +
    sweep_page``, and every aggregate requested later queues behind the copy's run. A
    change source may also hand over, in several polls, a batch it fetched earlier (about
    ``batch_size`` changes): those come on top. The ``concurrency`` is a margin for runs
    that finish meanwhile.
    """
    return max_backlog + sweep_page + max(batch_size, sweep_page) + concurrency


class TrimmedIds:
    """Entry IDs this instance trimmed, per aggregate; safe across threads.

    Holds at most ``aggregates`` aggregates (those trimmed least recently go first) and
    at most ``per_aggregate`` IDs for each (the oldest trimmed go first).
    """

    def __init__(self, aggregates: int, per_aggregate: int) -> None:
        if aggregates < 1 or per_aggregate < 1:
            raise ValueError("aggregates and per_aggregate must be at least 1")
        self.aggregates = aggregates
        self.per_aggregate = per_aggregate
        #: aggregate -> its trimmed entry IDs, oldest first; aggregates oldest first.
        self._trimmed: OrderedDict[AggregateId, dict[str, None]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config: Sizes) -> TrimmedIds:
        """Sized for what a dispatcher with ``config`` can have in flight."""
        aggregates = aggregates_in_flight(
            max_backlog=config.max_backlog,
            batch_size=config.batch_size,
            sweep_page=config.sweep_page,
            concurrency=config.concurrency,
        )
        return cls(aggregates, PER_AGGREGATE)

    def __len__(self) -> int:
        """How many IDs are remembered, over every aggregate."""
        with self._lock:
            return sum(len(ids) for ids in self._trimmed.values())

    def remembered(self) -> int:
        """How many aggregates have IDs remembered."""
        with self._lock:
            return len(self._trimmed)

    def __contains__(self, item: object) -> bool:
        """``(aggregate_id, entry_id) in trimmed``."""
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        with self._lock:
            ids = self._trimmed.get(item[0])
            return ids is not None and item[1] in ids

    def add(self, doc: Document, entry_ids: Iterable[str]) -> None:
        """Remember that ``entry_ids`` of ``doc`` (the copy they were published from) were
        trimmed."""
        aggregate_id = doc.get(ID)
        if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
            return
        with self._lock:
            ids = self._trimmed.pop(aggregate_id, None) or {}
            for entry_id in entry_ids:
                ids.pop(entry_id, None)
                ids[entry_id] = None
            while len(ids) > self.per_aggregate:
                del ids[next(iter(ids))]
            self._trimmed[aggregate_id] = ids  # now the most recent
            while len(self._trimmed) > self.aggregates:
                self._trimmed.popitem(last=False)

    def unpublished(self, doc: Document | None) -> Document | None:
        """``doc`` (a copy that came with an event or a sweep page) without the entries this
        instance trimmed (an older copy than its trims may show them)."""
        if doc is None:
            return None
        aggregate_id = doc.get(ID)
        if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
            return doc
        outbox = doc.get("outbox") or []
        with self._lock:
            ids = self._trimmed.get(aggregate_id)
            if ids is None:
                return doc
            skip = {e.get("id") for e in outbox if isinstance(e, dict) and e.get("id") in ids}
        return without_entries(doc, outbox, skip)


def without_entries(doc: Document, outbox: list[Any], skip: set[Any]) -> Document:
    """``doc`` without the entries of ``outbox`` (its outbox) whose ID is in ``skip``, or
    ``doc`` itself when ``skip`` is empty. The copy loses its revision tag, which no longer
    describes it."""
    if not skip:
        return doc
    fresh = [e for e in outbox if not (isinstance(e, dict) and e.get("id") in skip)]
    return {k: v for k, v in doc.items() if k != REVISION} | {"outbox": fresh}
