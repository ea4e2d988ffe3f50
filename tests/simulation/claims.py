"""The claim check in the simulated world: its payload store, faults and checks.

The payload store is :class:`~docoutbox.testing.payloads.MemoryPayloads`; the world
performs its operations with the claim faults of the schedule
(:data:`~tests.simulation.schedule.CLAIM_FAULTS`) and checks, as they happen:

- ``claim-unput``: a commit that stores a claim-checked entry finds its payload whole in
  the payload store (put before the commit, and not swept since);
- ``claim-resolved``: a claim-checked entry is published with the payload its commit
  referenced (never its reference, never another payload);
- ``claim-deleted-early``: the dispatcher deletes a payload only once no stored entry
  and no dead letter refers to it (after the trim committed, and never for a quarantined
  entry);
- ``claim-swept-referenced``: the orphan sweep never deletes a payload a pending entry
  or a dead letter refers to;
- ``claim-quarantined-inline``: a claim-checked entry is quarantined as stored, with its
  reference, never with its payload inline (a dead letter over the database's limit
  could not be written, and its aggregate's dispatch would be stuck);
- ``claim-quarantined-unread``: a claim-checked entry is quarantined only by a
  dispatcher whose last read of its payload found it whole (a missing payload is never
  given up: its entry stays pending).

A lost payload shows as well in ``published`` and ``liveness``: its entry can never be
published.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from docoutbox.errors import PayloadMissing, TransientStoreError
from docoutbox.model import OutboxMessage
from docoutbox.stored.claim import (
    DeletePayloads,
    DeleteStale,
    FindStale,
    GetPayload,
    PayloadOp,
    PutPayload,
)
from docoutbox.stored.reference import claim_of
from docoutbox.stored.sweep import referenced
from docoutbox.stored.values import entry_context
from docoutbox.testing.payloads import MemoryPayloads
from tests.simulation.schedule import CODEC

#: How long a slow put keeps its process waiting, in simulated milliseconds: longer than
#: the sweep's grace, so the sweep may take the put for an orphan meanwhile.
SLOW_PUT_MS = 250


class Claims:
    """``fault`` draws a fault (the world's), ``violation`` reports one, ``load`` reads a
    producer document as it is now, ``dead`` tells whether a dead letter refers to a
    payload."""

    def __init__(
        self,
        fault: Callable[[str], bool],
        violation: Callable[[str, str], None],
        stats: Counter[str],
        load: Callable[[Any], Any],
        dead: Callable[[str], bool],
    ) -> None:
        self.fault = fault
        self.violation = violation
        self.stats = stats
        self.load = load
        self.dead = dead
        #: (process, payload ID) -> whether that process's last read found it whole.
        self.read: dict[tuple[str, str], bool] = {}
        self.payloads = MemoryPayloads()
        #: Payload ID -> the aggregate whose entry refers to it (from its puts).
        self.owners: dict[str, Any] = {}
        #: Entry ID -> the payload its commit referenced (plain).
        self.expected: dict[str, Any] = {}
        #: Set by a slow put: the process that made it waits (see :meth:`take_slow`).
        self._slow = False

    def take_slow(self) -> bool:
        """Whether the operation just performed was a slow put (once)."""
        slow, self._slow = self._slow, False
        return slow

    def perform(self, op: PayloadOp, owner: str) -> Any:
        stats = self.stats
        if isinstance(op, PutPayload):
            if self.fault("put_error"):
                raise TransientStoreError("injected: the payload put failed")
            self.owners[op.info.payload_id] = op.info.aggregate_id
            self.payloads.put(op.info, op.data)
            self._slow = self.fault("put_slow")
            stats["claim.put"] += 1
            return None
        if isinstance(op, GetPayload):
            if self.fault("get_error"):
                raise TransientStoreError("injected: the payload read failed")
            self.read[owner, op.payload_id] = False
            if self.fault("payload_lost"):
                raise PayloadMissing("injected: the payload store found nothing this time")
            stats["claim.get"] += 1
            data = self.payloads.get(op.payload_id)
            self.read[owner, op.payload_id] = True
            return data
        if isinstance(op, DeletePayloads):
            if self.fault("delete_error"):
                raise TransientStoreError("injected: the payload delete failed")
            for payload_id in op.payload_ids:
                if self._referenced(payload_id):
                    self.violation(
                        "claim-deleted-early",
                        f"payload {payload_id} deleted while an entry or a dead letter "
                        "refers to it",
                    )
            stats["claim.deleted"] += len(op.payload_ids)
            return self.payloads.delete(op.payload_ids)
        if isinstance(op, FindStale):
            if self.fault("find_error"):
                raise TransientStoreError("injected: the stale payload query failed")
            return self.payloads.stale(op.before, op.limit)
        assert isinstance(op, DeleteStale)
        stored = self.payloads.items.get(op.info.payload_id)
        if stored is not None and stored[0] == op.info and self._referenced(op.info.payload_id):
            self.violation(
                "claim-swept-referenced",
                f"the sweep deleted payload {op.info.payload_id}, which a pending entry or a "
                "dead letter refers to",
            )
        swept = self.payloads.delete_stale(op.info)
        stats["claim.swept"] += swept
        return swept

    def _referenced(self, payload_id: str) -> bool:
        owner = self.owners.get(payload_id)
        doc = None if owner is None else self.load(owner)
        return referenced(doc, payload_id) or self.dead(payload_id)

    def committed(self, entries: Any) -> None:
        """Check and remember the claim-checked entries a producer commit stored."""
        for entry in entries:
            claim = claim_of(entry)
            if claim is None:
                continue
            self.stats["claim.committed"] += 1
            found = self.payloads.items.get(str(claim.get("id")))
            if found is None or len(found[1]) != claim.get("size"):
                self.violation(
                    "claim-unput",
                    f"entry {entry['id']} committed a reference to payload {claim.get('id')}, "
                    "which the payload store does not hold whole",
                )
                continue
            value = json.loads(found[1])
            if isinstance(value, str):
                value = CODEC.decode(value, entry_context(entry, "payload"))
            self.expected[str(entry["id"])] = value

    def check_published(self, entry: OutboxMessage) -> None:
        expected = self.expected.get(entry.id)
        if expected is not None and entry.payload != expected:
            self.violation(
                "claim-resolved",
                f"{entry.aggregate_id}#{entry.seq} published with {entry.payload!r:.80}, "
                f"not its payload",
            )

    def check_quarantined(self, entry: dict[str, Any], owner: str) -> None:
        where = f"{entry.get('aggregate_id')}#{entry.get('seq')}"
        if str(entry.get("id")) in self.expected and claim_of(entry) is None:
            self.violation(
                "claim-quarantined-inline",
                f"{where}, claim-checked, quarantined with its payload instead of its reference",
            )
        claim = claim_of(entry)
        if claim is not None and not self.read.get((owner, str(claim.get("id")))):
            self.violation(
                "claim-quarantined-unread",
                f"{where} quarantined, though its payload was not read whole",
            )
        if claim is not None:
            self.stats["claim.quarantined"] += 1
