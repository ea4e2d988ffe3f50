"""What a payload store provides: the claim check's side storage for large payloads.

Rule: a payload is visible whole or not at all. ``put`` makes a payload readable only
once every byte of it is stored (an adapter that splits it into chunks writes the
chunks first and a manifest last, and a reader checks the chunks against the manifest),
so a put cut short by a crash is never read as a whole payload: it reads as missing
(:class:`~docoutbox.errors.PayloadMissing`). ``put`` of an ID already stored replaces it
(a retried handle puts again, idempotently) and stamps a new ``stored_at``.

The sweep of orphans (:mod:`docoutbox.stored.sweep`) finds payloads by age with
``stale`` and removes one with ``delete_stale``, which deletes only the very put it was
shown (the same ``stored_at`` and ``generation``): a payload put again since is kept.

A quarantined claim-checked entry is dead-lettered with its reference, and its payload
stays for it: the sweep asks the dead-letter store too (:class:`ClaimedByDeadLetters`)
before it removes a payload.

Optional capabilities of a kit: :class:`PayloadKit` and :class:`AsyncPayloadKit`, a
kit that opens the payload store beside its collection, checked once when the store
or dispatcher is built. Of a payload store: :class:`IndexedPayloads`, indexes of its own
(MongoDB's side collection), created by the aggregate store's ``ensure_indexes`` with the
collection's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from docoutbox.model import AggregateId


@dataclass(frozen=True)
class PayloadInfo:
    """What a payload store keeps beside a payload's bytes.

    ``aggregate_id`` and ``entry_id`` name the outbox entry that refers to it (the sweep
    looks for that entry); ``generation`` tells one put of the same ID from another.
    """

    payload_id: str
    aggregate_id: AggregateId
    entry_id: str
    size: int
    stored_at: datetime
    generation: str


@runtime_checkable
class PayloadStore(Protocol):
    """Large payloads by ID, used synchronously."""

    def put(self, info: PayloadInfo, data: bytes) -> None:
        """Store ``data`` under ``info.payload_id``, replacing any earlier put of it;
        readable only once whole. :class:`~docoutbox.errors.StoreError` on failure."""
        ...

    def get(self, payload_id: str) -> bytes:
        """The bytes last put whole under ``payload_id``;
        :class:`~docoutbox.errors.PayloadMissing` if none are."""
        ...

    def delete(self, payload_ids: Collection[str]) -> None:
        """Remove these payloads (an ID not stored is no error)."""
        ...

    def stale(self, before: datetime, limit: int) -> list[PayloadInfo]:
        """Up to ``limit`` payloads stored before ``before``, oldest first."""
        ...

    def delete_stale(self, info: PayloadInfo) -> bool:
        """Remove the payload if it is still the put ``info`` describes (same
        ``stored_at`` and ``generation``); False when it was put again or is gone."""
        ...


@runtime_checkable
class AsyncPayloadStore(Protocol):
    """The async twin of :class:`PayloadStore`."""

    async def put(self, info: PayloadInfo, data: bytes) -> None: ...

    async def get(self, payload_id: str) -> bytes: ...

    async def delete(self, payload_ids: Collection[str]) -> None: ...

    async def stale(self, before: datetime, limit: int) -> list[PayloadInfo]: ...

    async def delete_stale(self, info: PayloadInfo) -> bool: ...


@runtime_checkable
class IndexedPayloads(Protocol):
    """Optional: a payload store (sync or async alike) whose queries need indexes of its
    own, created by ``ensure_indexes`` (idempotent). An aggregate store with a claim check
    on it creates them in its own ``ensure_indexes``."""

    def ensure_indexes(self) -> Any: ...


@runtime_checkable
class PayloadKit(Protocol):
    """Optional: a sync kit that opens a payload store beside its collection (a side
    collection on MongoDB, a side container on Cosmos DB), for the claim check."""

    @property
    def payloads(self) -> PayloadStore: ...


@runtime_checkable
class AsyncPayloadKit(Protocol):
    """Optional: the async twin of :class:`PayloadKit`."""

    @property
    def payloads(self) -> AsyncPayloadStore: ...


@runtime_checkable
class ClaimedByDeadLetters(Protocol):
    """A dead-letter store, as the orphan sweep asks it: whether a dead letter refers to
    a payload (holds a claim-checked entry with that payload ID)."""

    def refers_to(self, payload_id: str) -> bool: ...


@runtime_checkable
class AsyncClaimedByDeadLetters(Protocol):
    """The async twin of :class:`ClaimedByDeadLetters`."""

    async def refers_to(self, payload_id: str) -> bool: ...
