"""Dead letters, listed, shown, replayed and purged over any store
(:class:`DeadLetterStore`): the ``docoutbox dead-letters`` commands.

Dead letters live in one collection or container whatever put them there: ``origin:
"dispatch"`` (or none) for entries the dispatcher quarantined, ``origin: "consume"`` (with
``queue`` and the raw ``body``) for deliveries a consumer rejected. A store shows each as
a mapping with ``_id`` (the entry's ID), ``aggregate_id``, ``entry``, ``error``,
``attempts`` and ``quarantined_at``.

Replay, rule: a replay never changes ``version`` and never reorders an aggregate's
pending entries.

- A dispatcher dead letter is re-appended to its aggregate's outbox with its ``seq`` and a
  new ID (``<old id>~r<random>``, the old one in the ``docoutbox-replay-of`` header):
  dispatchers remember the IDs they trimmed and never publish one again. The dispatcher
  publishes pending entries in ``seq`` order, so the replayed entry goes out before any
  entry of that aggregate still pending; receivers using exact de-duplication
  ``(source, seq)`` see the gap its quarantine left filled (and recognise it if the
  original did arrive). The append is conditional on no entry with that ``seq`` being
  pending, and never touches ``version`` or ``outbox_seq``, so it cannot fail or be
  undone by a concurrent commit. The dead letter is deleted after the append: a crash in
  between leaves both, and a second replay is then a no-op while the first copy is
  pending.
- A consumer dead letter is published again, body unchanged, to the queue it came from
  (``republish``), then deleted.

A claim-checked entry (:mod:`docoutbox.stored.claim`) is dead-lettered as stored, with
its reference, and its payload stays in the payload store: the replay re-appends it
with that reference, and the dispatcher reads the payload back and publishes it whole
(then deletes it after the trim, as for any published entry). A purge leaves the
payload to the orphan sweep (:mod:`docoutbox.stored.sweep`), which keeps a payload while
a dead letter or a pending entry refers to it. An encoded claim-checked entry is not
replayed: its payload is sealed under the entry's ID, which a replay changes.

Entries encoded by a store codec (:mod:`docoutbox.stored`) are replayed only by an admin
given the stores' values (``values=``): the entry is decoded (and its payload upcast),
given its new ID and replay headers, and sealed again as the store would (encrypted under
the current key), so no plaintext reaches the outbox. Without them, such a dead letter is
refused by name.

Every ID is checked before anything changes: an unknown ID, a malformed entry, an
aggregate that no longer exists (or is of another type) fails the whole request.

By failure group (:mod:`docoutbox.dispatch.tools.failures`): :meth:`DeadLetterAdmin.groups`
summarizes the dead letters by fingerprint; :meth:`DeadLetterAdmin.members` names a
group's dead letters as they are now, which ``replay`` and ``purge`` then take as IDs
(a dead letter that joins the group afterwards is left for the next request).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from docoutbox.dispatch.tools.failures import FailureGroup, failure_groups, fingerprint
from docoutbox.errors import InvalidInput, NotFound
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.store.document import utcnow
from docoutbox.stored.reference import claim_of
from docoutbox.stored.values import StoredValues, open_entry

#: Publishes a raw body to a queue (consumer dead letters).
Republish = Callable[[str, bytes], None]

#: What :meth:`DeadLetterStore.aggregate_type` answers for an aggregate that is gone.
GONE = object()


class DeadLetterStore(Protocol):
    #: Where the aggregates are (a collection or container name), None if not given.
    aggregates: str | None

    def listing(self, limit: int) -> list[dict[str, Any]]:
        """The dead letters, oldest first; at most ``limit`` (0: all)."""
        ...

    def count(self) -> int: ...

    def find(self, dead_letter_id: str) -> dict[str, Any] | None: ...

    def delete(self, ids: Sequence[str] | None) -> int:
        """Delete those dead letters (None: all of them); how many went."""
        ...

    def aggregate_type(self, aggregate_id: AggregateId) -> object:
        """The stored ``type`` of the aggregate (None if it has none), or :data:`GONE`."""
        ...

    def append(self, aggregate_id: AggregateId, entry: dict[str, Any]) -> bool:
        """Append ``entry`` to the aggregate's outbox unless an entry with its ``seq`` is
        pending, without touching ``version``; whether it was appended."""
        ...


@dataclass(frozen=True)
class Replayed:
    id: str
    action: str  # "re-appended", "already pending", "republished"
    where: str


class DeadLetterAdmin:
    """List, show, replay and purge the dead letters of one store."""

    def __init__(self, store: DeadLetterStore, values: StoredValues | None = None) -> None:
        self.store = store
        #: Decodes and seals again entries a store codec encoded (None: refuse them).
        self.values = values

    def listing(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.store.listing(limit)

    def count(self) -> int:
        return self.store.count()

    def get(self, dead_letter_id: str) -> dict[str, Any]:
        doc = self.store.find(dead_letter_id)
        if doc is None:
            raise NotFound(f"no dead letter {dead_letter_id!r}")
        return doc

    def groups(self) -> list[FailureGroup]:
        """The dead letters by failure group, largest first."""
        return failure_groups(self.store.listing(0))

    def members(self, group: str) -> list[str]:
        """The IDs of the dead letters of fingerprint ``group``, oldest first; raises
        :class:`~docoutbox.errors.NotFound` when none has it."""
        ids = [str(doc["_id"]) for doc in self.store.listing(0) if fingerprint(doc) == group]
        if not ids:
            raise NotFound(f"no dead letter in failure group {group!r}")
        return ids

    def _check(self, doc: Mapping[str, Any], republish: Republish | None) -> None:
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
        where = self.store.aggregates
        if where is None:
            raise InvalidInput(
                f"dead letter {name!r} belongs to an outbox: name its collection (--collection)"
            )
        stored = doc.get("entry")
        if _encoded(stored) and self.values is None:
            raise InvalidInput(
                f"dead letter {name!r} holds an entry encoded by a store codec "
                "(docoutbox.stored): replay it with the stores' codec (--decode)"
            )
        claim = claim_of(stored)
        if claim is not None and (claim.get("encoded") or _encoded(stored)):
            raise InvalidInput(
                f"dead letter {name!r} holds a claim-checked entry encoded by a store codec: "
                "its payload is bound to the entry's ID, which a replay changes; publish it "
                "from the payload store by hand, then purge it"
            )
        try:
            entry = OutboxMessage.parse(open_entry(None, self._opened(stored)))
        except InvalidInput as exc:
            raise InvalidInput(
                f"dead letter {name!r} holds a malformed entry and cannot be replayed "
                f"(purge it once handled): {exc}"
            ) from exc
        kind = self.store.aggregate_type(entry.aggregate_id)
        if kind is GONE:
            raise NotFound(
                f"dead letter {name!r}: aggregate {entry.aggregate_id!r} no longer exists in "
                f"{where!r}; nothing was replayed"
            )
        if kind not in (None, entry.aggregate_type):
            raise InvalidInput(
                f"dead letter {name!r} belongs to a {entry.aggregate_type} but "
                f"{entry.aggregate_id!r} in {where!r} is a {kind}; nothing was replayed"
            )

    def replay(self, ids: Sequence[str], republish: Republish | None = None) -> list[Replayed]:
        """Replay every dead letter of ``ids``, or none of them (see the module doc)."""
        if not ids:
            raise InvalidInput("name at least one dead letter to replay")
        docs = [self.get(name) for name in dict.fromkeys(ids)]
        for doc in docs:
            self._check(doc, republish)
        return [self._replay(doc, republish) for doc in docs]

    def _replay(self, doc: Mapping[str, Any], republish: Republish | None) -> Replayed:
        name = doc["_id"]
        if doc.get("origin") == "consume":
            assert republish is not None
            body = doc["body"]
            republish(doc["queue"], body.encode() if isinstance(body, str) else body)
            self.store.delete([name])
            return Replayed(name, "republished", f"queue {doc['queue']}")
        entry = self._opened(doc["entry"])
        headers = dict(entry.get("headers") or {})
        headers["docoutbox-replay-of"] = str(entry["id"])
        headers["docoutbox-replayed-at"] = utcnow().isoformat()
        new_id = f"{entry['id']}~r{uuid.uuid4().hex[:8]}"
        entry.update(id=new_id, attempts=0, last_error=None, headers=headers)
        aggregate_id = entry["aggregate_id"]
        if _encoded(doc["entry"]) and self.values is not None:
            entry = self.values.seal_entry(entry)  # stored as the store would store it
        appended = self.store.append(aggregate_id, entry)
        self.store.delete([name])
        where = f"{self.store.aggregates}/{aggregate_id!r} seq {entry['seq']}"
        if appended:
            return Replayed(name, "re-appended", f"{where} as {new_id}")
        return Replayed(name, "already pending", where)

    def _opened(self, stored: Any) -> Any:
        """The dead letter's entry decoded and upcast, when it is encoded."""
        if _encoded(stored) and self.values is not None:
            return self.values.open_entry(stored)
        return dict(stored) if isinstance(stored, dict) else stored

    def purge(self, ids: Sequence[str] = ()) -> int:
        """Delete the named dead letters (all of them if none is named); how many went."""
        for name in ids:
            self.get(name)  # unknown IDs fail before anything is deleted
        return self.store.delete(list(ids) if ids else None)


def _encoded(entry: object) -> bool:
    """Whether a dead letter's entry holds values a store codec encoded."""
    return isinstance(entry, dict) and any(
        isinstance(entry.get(name), str) for name in ("payload", "headers")
    )
