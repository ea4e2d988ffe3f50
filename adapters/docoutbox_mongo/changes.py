"""A MongoDB change stream as a :class:`docoutbox.ports.dispatch.ChangeSource`.

The stream watches inserts, updates and replaces whose looked-up document still has a
pending entry (``fullDocument.outbox.0``), and keeps of each event only its resume token,
its operation type and the document's :data:`EVENT_FIELDS`. Documents are identified by
``fullDocument._id`` (with ``full_document="updateLookup"``), not by ``documentKey``,
which some servers fill wrongly. The stream is polled with ``try_next()``: it never
blocks, whatever the server does with ``maxAwaitTimeMS``. The first poll after the stream
opens sends no ``getMore`` when the opening's reply brought no change: that reply is the
server's answer of a moment ago (on the wire server every read scans the whole oplog).

Positions are ``{"resume_after": <resume token>}`` or ``{"start_at": <Timestamp>}``.

When a batch ends, the stream's ``resume_token`` is the server's
``postBatchResumeToken`` where it sends one (MongoDB 4.0.7+): a position past changes the
pipeline filtered out. :meth:`MongoChangeSource.poll` reports it as an event without a
document, so a quiet collection's checkpoint keeps moving and a restart after a long idle
period resumes from a recent position instead of replaying (or losing) old history.

:class:`AsyncMongoChangeSource` is the async twin, on pymongo's ``AsyncCollection`` or
Motor's ``AsyncIOMotorCollection``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

from bson import Timestamp

from docoutbox.errors import ChangeStreamLost
from docoutbox.ports.dispatch import ChangeEvent, Position
from docoutbox_mongo.errors import translated, translated_stream

#: What an event keeps of its document: what the dispatcher reads (the aggregate, its
#: partition, its pending entries, when it was written). Not the state, the inbox or the
#: update description: an event stays small however large the document, and a document
#: near MongoDB's 16 MiB limit cannot make an event over it, which would stop the stream.
#: Scheduled entries need four more: the cancelled IDs (trimmed, never published), the
#: due-time hint (the dispatcher's timer), ``outbox_seq`` (the guard of a release, which
#: numbers the entry) and ``version`` (the guard of a settle).
EVENT_FIELDS = (
    "_id",
    "partition",
    "outbox",
    "updated_at",
    "outbox_seq",
    "version",
    "cancelled",
    "earliest_due",
)

PIPELINE: list[dict[str, Any]] = [
    {"$match": {"operationType": {"$in": ["insert", "update", "replace"]}}},
    {"$match": {"fullDocument.outbox.0": {"$exists": True}}},
    {"$project": {"operationType": 1, **{f"fullDocument.{f}": 1 for f in EVENT_FIELDS}}},
]


def stream_args(position: Position) -> dict[str, Any]:
    """The ``watch()`` arguments that resume after ``position``; ChangeStreamLost if bad."""
    if isinstance(position, Mapping) and len(position) == 1:
        token = position.get("resume_after")
        if isinstance(token, Mapping) and token:
            return {"resume_after": dict(token)}
        start = position.get("start_at")
        if isinstance(start, Timestamp):
            return {"start_at_operation_time": start}
    raise ChangeStreamLost(f"not a change stream position: {position!r}")


def _buffered(stream: Any) -> bool:
    """Whether ``stream`` holds events received but not returned yet (so the next
    ``try_next()`` needs no round trip). Unknown (a driver's internals differ): True."""
    stream = getattr(stream, "delegate", stream)  # Motor wraps pymongo's stream
    data = getattr(getattr(stream, "_cursor", None), "_data", None)
    try:
        return len(data) > 0 if data is not None else True
    except TypeError:
        return True


class MongoChangeSource:
    """Changes of one pymongo ``Collection`` that leave pending outbox entries.

    ``start_marker`` uses the server's ``operationTime`` when it reports one; otherwise
    the local clock minus ``margin`` seconds (replaying a little is harmless: the
    dispatcher reloads each document before publishing).

    ``batch_size`` caps the changes the server sends per round trip (None: the server's
    default, up to 16 MiB): a smaller batch bounds the memory a long backlog takes, at the
    cost of more round trips.
    """

    def __init__(
        self,
        collection: Any,
        *,
        margin: float = 2.0,
        clock: Callable[[], float] = time.time,
        batch_size: int | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.collection = collection
        self.margin = margin
        self.batch_size = batch_size
        self._clock = clock
        self._stream: Any = None
        self._token: Any = None
        #: The stream opened since the last poll (see :meth:`_fresh_and_empty`).
        self._opened = False

    def start_marker(self) -> Position:
        with translated():
            reply = self.collection.database.command("ping")
        op_time = reply.get("operationTime")
        if not isinstance(op_time, Timestamp):
            op_time = Timestamp(max(1, int(self._clock() - self.margin)), 0)
        return {"start_at": op_time}

    def open(self, position: Position) -> None:
        args = stream_args(position)
        self.close()
        with translated_stream():
            self._stream = self.collection.watch(
                PIPELINE, full_document="updateLookup", batch_size=self.batch_size, **args
            )
        self._token = args.get("resume_after")
        self._opened = True

    def _fresh_and_empty(self) -> bool:
        """Whether this is the first poll since the stream opened and the opening's reply
        holds no change: the server answered "nothing yet" a moment ago, so this poll
        sends no ``getMore`` (the next one does). Unknown buffering counts as not empty."""
        opened, self._opened = self._opened, False
        return opened and not _buffered(self._stream)

    def poll(self, max_events: int) -> list[ChangeEvent]:
        if self._stream is None:
            raise ChangeStreamLost("the change stream is not open")
        events: list[ChangeEvent] = []
        if self._fresh_and_empty():
            return events
        with translated_stream():
            while len(events) < max_events:
                if events and not _buffered(self._stream):
                    break  # hand over what arrived rather than wait for another getMore
                change = self._stream.try_next()
                if change is None:
                    self._batch_end(events)
                    break
                if change.get("operationType") == "invalidate":
                    self.close()
                    raise ChangeStreamLost("the change stream was invalidated")
                events.append(self._event(change))
        return events

    def _event(self, change: Mapping[str, Any]) -> ChangeEvent:
        self._token = change["_id"]
        # An update's document is looked up when the event is read; an insert's (or a
        # replace's) is the document as of the change, perhaps long trimmed since.
        current = change.get("operationType") == "update"
        return ChangeEvent({"resume_after": change["_id"]}, change.get("fullDocument"), current)

    def _batch_end(self, events: list[ChangeEvent]) -> None:
        """At a batch's end, the server's ``postBatchResumeToken`` if it moved past the
        last change: a position-only event."""
        token = getattr(self._stream, "resume_token", None)
        if isinstance(token, Mapping) and token and token != self._token:
            self._token = token
            events.append(ChangeEvent({"resume_after": dict(token)}, None))

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with translated():
                stream.close()


class AsyncMongoChangeSource(MongoChangeSource):
    """The async twin of :class:`MongoChangeSource` (pymongo async or Motor)."""

    async def start_marker(self) -> Position:
        with translated():
            reply = await self.collection.database.command("ping")
        op_time = reply.get("operationTime")
        if not isinstance(op_time, Timestamp):
            op_time = Timestamp(max(1, int(self._clock() - self.margin)), 0)
        return {"start_at": op_time}

    async def open(self, position: Position) -> None:  # type: ignore[override]
        args = stream_args(position)
        await self.close()
        with translated_stream():
            stream = self.collection.watch(
                PIPELINE, full_document="updateLookup", batch_size=self.batch_size, **args
            )
            if inspect.isawaitable(stream):  # pymongo async; Motor opens lazily
                stream = await stream
            self._stream = stream
        self._token = args.get("resume_after")
        self._opened = True

    async def poll(self, max_events: int) -> list[ChangeEvent]:  # type: ignore[override]
        if self._stream is None:
            raise ChangeStreamLost("the change stream is not open")
        events: list[ChangeEvent] = []
        if self._fresh_and_empty():
            return events
        with translated_stream():
            while len(events) < max_events:
                if events and not _buffered(self._stream):
                    break  # hand over what arrived rather than wait for another getMore
                change = await self._stream.try_next()
                if change is None:
                    self._batch_end(events)
                    break
                if change.get("operationType") == "invalidate":
                    await self.close()
                    raise ChangeStreamLost("the change stream was invalidated")
                events.append(self._event(change))
        return events

    async def close(self) -> None:  # type: ignore[override]
        stream, self._stream = self._stream, None
        if stream is not None:
            with translated():
                await stream.close()
