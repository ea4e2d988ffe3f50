"""Operating the outbox on MongoDB: backlog figures, dead letters, leases.

Used by the ``docoutbox outbox``, ``docoutbox dead-letters`` and ``docoutbox leases``
commands, and usable directly.

Dead letters live in one collection (``docoutbox_dead_letters``) whatever put them there:
``origin: "dispatch"`` for entries the dispatcher quarantined, ``origin: "consume"`` (with
``queue`` and the raw ``body``) for deliveries a consumer rejected.

Replay, rule: a replay never changes ``version`` and never reorders an aggregate's
pending entries.

- A dispatcher dead letter is re-appended to its aggregate's outbox with its ``seq`` and a
  new ID (``<old id>~r<random>``, the old one in the ``docoutbox-replay-of`` header):
  dispatchers remember the IDs they trimmed and never publish one again. The dispatcher
  publishes pending entries in ``seq`` order, so the replayed entry goes out before any
  entry of that aggregate still pending; receivers using exact de-duplication
  ``(source, seq)`` see the gap its quarantine left filled (and recognise it if the
  original did arrive). The push is conditional on no entry with that ``seq`` being
  pending, and never touches ``version`` or ``outbox_seq``, so it cannot fail or be
  undone by a concurrent commit. The dead letter is deleted after the push: a crash in
  between leaves both, and a second replay is then a no-op push while the first copy is
  pending.
- A consumer dead letter is published again, body unchanged, to the queue it came from
  (``republish``), then deleted.

Every ID is checked before anything changes: an unknown ID, a malformed entry, an
aggregate that no longer exists (or is of another type) fails the whole request.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING

from docoutbox.dispatch.backlog import OutboxStats, summarize
from docoutbox.dispatch.lease_rows import LeaseRow
from docoutbox.dispatch.lease_rows import lease_rows as rows_of
from docoutbox.errors import InvalidInput, NotFound
from docoutbox.model import OutboxMessage
from docoutbox.store.document import utcnow
from docoutbox_mongo.errors import translated

#: Publishes a raw body to a queue (consumer dead letters).
Republish = Callable[[str, bytes], None]

PENDING = {"outbox.0": {"$exists": True}}
STATS_PROJECTION = {"_id": 1, "partition": 1, "outbox.type": 1, "outbox.created_at": 1}


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def outbox_stats(collection: Any, now: datetime | None = None) -> OutboxStats:
    """The backlog of ``collection``, read through a projection of the pending documents."""
    with translated():
        docs = list(collection.find(PENDING, STATS_PROJECTION))
    return summarize(docs, now)


@dataclass(frozen=True)
class Replayed:
    id: str
    action: str  # "re-appended", "already pending", "republished"
    where: str


class DeadLetterAdmin:
    """List, show, replay and purge the dead letters of one database."""

    def __init__(self, dead_letters: Any, aggregates: Any | None = None) -> None:
        self.dead_letters = dead_letters
        self.aggregates = aggregates

    def listing(self, limit: int = 100) -> list[dict[str, Any]]:
        with translated():
            cursor = self.dead_letters.find({}).sort([("quarantined_at", ASCENDING)])
            return list(cursor.limit(limit)) if limit else list(cursor)

    def count(self) -> int:
        with translated():
            return int(self.dead_letters.count_documents({}))

    def get(self, dead_letter_id: str) -> dict[str, Any]:
        with translated():
            doc = self.dead_letters.find_one({"_id": dead_letter_id})
        if doc is None:
            raise NotFound(f"no dead letter {dead_letter_id!r}")
        return dict(doc)

    def _check(self, doc: dict[str, Any], republish: Republish | None) -> None:
        name = doc["_id"]
        if doc.get("origin") == "consume":
            if republish is None:
                raise InvalidInput(
                    f"dead letter {name!r} was rejected by a consumer of queue "
                    f"{doc.get('queue')!r}: replaying it needs a broker (--rabbitmq-url)"
                )
            if not isinstance(doc.get("body"), str | bytes) or not doc.get("queue"):
                raise InvalidInput(f"dead letter {name!r} has no body or queue to replay")
            return
        if self.aggregates is None:
            raise InvalidInput(
                f"dead letter {name!r} belongs to an outbox: name its collection (--collection)"
            )
        try:
            entry = OutboxMessage.parse(doc.get("entry"))
        except InvalidInput as exc:
            raise InvalidInput(
                f"dead letter {name!r} holds a malformed entry and cannot be replayed "
                f"(purge it once handled): {exc}"
            ) from exc
        with translated(entry.aggregate_id):
            aggregate = self.aggregates.find_one({"_id": entry.aggregate_id}, {"type": 1})
        if aggregate is None:
            raise NotFound(
                f"dead letter {name!r}: aggregate {entry.aggregate_id!r} no longer exists in "
                f"{self.aggregates.name!r}; nothing was replayed"
            )
        if aggregate.get("type") not in (None, entry.aggregate_type):
            raise InvalidInput(
                f"dead letter {name!r} belongs to a {entry.aggregate_type} but "
                f"{entry.aggregate_id!r} in {self.aggregates.name!r} is a "
                f"{aggregate.get('type')}; nothing was replayed"
            )

    def replay(self, ids: Sequence[str], republish: Republish | None = None) -> list[Replayed]:
        """Replay every dead letter of ``ids``, or none of them (see the module doc)."""
        if not ids:
            raise InvalidInput("name at least one dead letter to replay")
        docs = [self.get(name) for name in dict.fromkeys(ids)]
        for doc in docs:
            self._check(doc, republish)
        return [self._replay(doc, republish) for doc in docs]

    def _replay(self, doc: dict[str, Any], republish: Republish | None) -> Replayed:
        name = doc["_id"]
        if doc.get("origin") == "consume":
            assert republish is not None
            body = doc["body"]
            republish(doc["queue"], body.encode() if isinstance(body, str) else body)
            self._forget(name)
            return Replayed(name, "republished", f"queue {doc['queue']}")
        assert self.aggregates is not None
        entry = dict(doc["entry"])
        headers = dict(entry.get("headers") or {})
        headers["docoutbox-replay-of"] = str(entry["id"])
        headers["docoutbox-replayed-at"] = utcnow().isoformat()
        new_id = f"{entry['id']}~r{uuid.uuid4().hex[:8]}"
        entry.update(id=new_id, attempts=0, last_error=None, headers=headers)
        aggregate_id = entry["aggregate_id"]
        with translated(aggregate_id):
            result = self.aggregates.update_one(
                {"_id": aggregate_id, "outbox.seq": {"$ne": entry["seq"]}},
                {"$push": {"outbox": entry}},
            )
        self._forget(name)
        where = f"{self.aggregates.name}/{aggregate_id!r} seq {entry['seq']}"
        if result.modified_count:
            return Replayed(name, "re-appended", f"{where} as {new_id}")
        return Replayed(name, "already pending", where)

    def _forget(self, name: str) -> None:
        with translated():
            self.dead_letters.delete_one({"_id": name})

    def purge(self, ids: Sequence[str] = ()) -> int:
        """Delete the named dead letters (all of them if none is named); how many went."""
        if ids:
            for name in ids:
                self.get(name)  # unknown IDs fail before anything is deleted
            query: dict[str, Any] = {"_id": {"$in": list(ids)}}
        else:
            query = {}
        with translated():
            return int(self.dead_letters.delete_many(query).deleted_count)


def lease_rows(
    collection: Any, group: str | None = None, now: datetime | None = None
) -> list[LeaseRow]:
    """Every lease and member heartbeat (of ``group``, or of all groups), partition order."""
    query: dict[str, Any] = {} if group is None else {"group": group}
    with translated():
        docs = list(collection.find(query))
    return rows_of(docs, now or utcnow(), _aware)
