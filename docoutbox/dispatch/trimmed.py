"""What this dispatcher trimmed lately, so that an older copy does not publish it again.

Rule: memory follows what is in flight, never the backlog. A run publishes from the copy
of the document that came with its request (an event's, a sweep page's); a copy read
before one of this instance's trims still shows the trimmed entries, and publishing them
again would be a duplicate (allowed by at-least-once delivery, but avoidable).
:class:`TrimmedIds` remembers the IDs each trim removed, per aggregate, and leaves them out
of later copies (:meth:`TrimmedIds.unpublished`).

Only a few aggregates can have such a copy: one in the engine's hands or in its read in
flight, together at most ``max_backlog + sweep_page`` aggregates. A copy waits behind at
most that many other aggregates' runs, so keeping the aggregates trimmed most recently,
that many (:func:`aggregates_in_flight`), covers every copy that can still come.

Per aggregate, a copy's own ``outbox_seq`` tells which trims it already reflects: an entry
with ``seq <= outbox_seq`` missing from the copy was gone when the copy was read, so no
later copy (copies of one aggregate are run in the order they were read) can show it, and
it is forgotten. A hard count bound holds whatever comes: at most ``aggregates`` aggregates, at
most ``per_aggregate`` IDs each (the oldest go first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from docoutbox.model import AggregateId
from docoutbox.store.document import ID, REVISION, Document

if TYPE_CHECKING:
    from docoutbox.dispatch.engine import DispatcherConfig

#: IDs remembered per aggregate at most: a copy showing more entries than that which this
#: instance trimmed since the copy was read may publish the oldest of them again.
PER_AGGREGATE = 1_000


def aggregates_in_flight(*, max_backlog: int, sweep_page: int, concurrency: int) -> int:
    """How many other aggregates' runs can trim between a trim and the run of a copy read
    before it.

    Copies come only from the engine's own reads, one at a time: a poll asks for at most
    ``min(batch_size, max_backlog)`` less the aggregates in hand, a sweep page (at most
    ``sweep_page``) is read only below ``max_backlog``. So the aggregates in hand when the
    trim happens plus those a read in flight brings stay under ``max_backlog +
    sweep_page``, and every aggregate requested later queues behind the copy's run. The
    ``concurrency`` is a margin for runs that finish meanwhile.
    """
    return max_backlog + sweep_page + concurrency


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
        #: aggregate -> {entry ID: its seq (None if the entry had none)}, oldest first.
        self._trimmed: OrderedDict[AggregateId, dict[str, int | None]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config: DispatcherConfig) -> TrimmedIds:
        """Sized for what a dispatcher with ``config`` can have in flight."""
        aggregates = aggregates_in_flight(
            max_backlog=config.max_backlog,
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
        seqs = _seqs(doc)
        with self._lock:
            ids = self._trimmed.pop(aggregate_id, None) or {}
            for entry_id in entry_ids:
                ids.pop(entry_id, None)
                ids[entry_id] = seqs.get(entry_id)
            while len(ids) > self.per_aggregate:
                del ids[next(iter(ids))]
            self._trimmed[aggregate_id] = ids  # now the most recent
            while len(self._trimmed) > self.aggregates:
                self._trimmed.popitem(last=False)

    def unpublished(self, doc: Document | None) -> Document | None:
        """``doc`` (a copy that came with an event or a sweep page) without the entries this
        instance trimmed since the copy was read; forgets what the copy shows was gone."""
        if doc is None:
            return None
        aggregate_id = doc.get(ID)
        if isinstance(aggregate_id, bool) or not isinstance(aggregate_id, str | int):
            return doc
        outbox = doc.get("outbox") or []
        shown = {e.get("id") for e in outbox if isinstance(e, dict)}
        last = doc.get("outbox_seq")
        last = last if isinstance(last, int) and not isinstance(last, bool) else None
        with self._lock:
            ids = self._trimmed.get(aggregate_id)
            if ids is None:
                return doc
            if last is not None:
                gone = [
                    i
                    for i, seq in ids.items()
                    if i not in shown and seq is not None and seq <= last
                ]
                for i in gone:
                    del ids[i]
                if not ids:
                    del self._trimmed[aggregate_id]
            skip = {i for i in shown if i in ids}
        if not skip:
            return doc
        fresh = [e for e in outbox if not (isinstance(e, dict) and e.get("id") in skip)]
        return {k: v for k, v in doc.items() if k != REVISION} | {"outbox": fresh}


def _seqs(doc: Document) -> dict[Any, int | None]:
    seqs: dict[Any, int | None] = {}
    for entry in doc.get("outbox") or []:
        if isinstance(entry, dict):
            seq = entry.get("seq")
            valid = isinstance(seq, int) and not isinstance(seq, bool)
            seqs[entry.get("id")] = seq if valid else None
    return seqs
