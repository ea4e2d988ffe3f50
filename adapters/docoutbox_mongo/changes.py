"""A MongoDB change stream as a :class:`docoutbox.dispatch.ports.ChangeSource`.

The stream watches inserts, updates and replaces whose looked-up document still has a
pending entry (``fullDocument.outbox.0``). Documents are identified by
``fullDocument._id`` (with ``full_document="updateLookup"``), not by ``documentKey``,
which some servers fill wrongly. The stream is polled with ``try_next()``: it never
blocks, whatever the server does with ``maxAwaitTimeMS``.

Positions are ``{"resume_after": <resume token>}`` or ``{"start_at": <Timestamp>}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from bson import Timestamp

from docoutbox.dispatch.ports import ChangeEvent, Position
from docoutbox.errors import ChangeStreamLost
from docoutbox_mongo.errors import translated, translated_stream

PIPELINE: list[dict[str, Any]] = [
    {"$match": {"operationType": {"$in": ["insert", "update", "replace"]}}},
    {"$match": {"fullDocument.outbox.0": {"$exists": True}}},
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


class MongoChangeSource:
    """Changes of one pymongo ``Collection`` that leave pending outbox entries.

    ``start_marker`` uses the server's ``operationTime`` when it reports one; otherwise
    the local clock minus ``margin`` seconds (replaying a little is harmless: the
    dispatcher reloads each document before publishing).
    """

    def __init__(
        self,
        collection: Any,
        *,
        margin: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.collection = collection
        self.margin = margin
        self._clock = clock
        self._stream: Any = None

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
            self._stream = self.collection.watch(PIPELINE, full_document="updateLookup", **args)

    def poll(self, max_events: int) -> list[ChangeEvent]:
        if self._stream is None:
            raise ChangeStreamLost("the change stream is not open")
        events: list[ChangeEvent] = []
        with translated_stream():
            while len(events) < max_events:
                change = self._stream.try_next()
                if change is None:
                    break
                if change.get("operationType") == "invalidate":
                    self.close()
                    raise ChangeStreamLost("the change stream was invalidated")
                document = change.get("fullDocument")
                events.append(ChangeEvent({"resume_after": change["_id"]}, document))
        return events

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with translated():
                stream.close()
