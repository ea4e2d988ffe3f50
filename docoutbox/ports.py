"""What an adapter must provide. Adapters execute plans; they decide nothing.

A store backend has a sync and an async twin with the same methods. The library's logic
lives in :mod:`docoutbox.flows` and is driven against either twin.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from docoutbox.document import Document
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.plan import WritePlan


@runtime_checkable
class StoreBackend(Protocol):
    """A collection of aggregate documents, used synchronously."""

    #: The largest document the database accepts, in bytes.
    max_document_bytes: int

    def document_size(self, document: Document) -> int:
        """The size the database would count for ``document``. Pure, no I/O."""
        ...

    def load(self, aggregate_id: AggregateId) -> Document | None:
        """The document, or None when it does not exist."""
        ...

    def write(self, plan: WritePlan) -> bool:
        """Execute ``plan`` as one conditional write.

        Return False when its condition did not hold (an insert whose ``_id`` exists, a
        commit whose expected version is stale, a trim of a missing document). Raise a
        :class:`~docoutbox.errors.StoreError` for database failures.
        """
        ...

    def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]:
        """Documents with a non-empty outbox, in ``_id`` order, strictly after ``after``.

        ``older_than`` keeps only those whose oldest pending entry was created before it.
        """
        ...

    def ensure_indexes(self) -> None:
        """Create the indexes the store's queries need (an explicit setup step)."""
        ...


@runtime_checkable
class AsyncStoreBackend(Protocol):
    """The async twin of :class:`StoreBackend`."""

    max_document_bytes: int

    def document_size(self, document: Document) -> int: ...

    async def load(self, aggregate_id: AggregateId) -> Document | None: ...

    async def write(self, plan: WritePlan) -> bool: ...

    async def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> list[Document]: ...

    async def ensure_indexes(self) -> None: ...


@runtime_checkable
class Publisher(Protocol):
    """Sends outbox entries to a broker, one at a time, in the order given.

    ``publish`` returns only once the broker has durably accepted the entry (publisher
    confirms). It raises :class:`~docoutbox.errors.PublishError` when the broker refuses
    or returns the message, :class:`~docoutbox.errors.PermanentPublishError` when it never
    will accept it, and :class:`~docoutbox.errors.BrokerUnavailable` when it cannot be
    reached. It never returns normally for a message that was not accepted.
    """

    def publish(self, entry: OutboxMessage) -> None: ...


@runtime_checkable
class AsyncPublisher(Protocol):
    """The async twin of :class:`Publisher`."""

    async def publish(self, entry: OutboxMessage) -> None: ...


@runtime_checkable
class DeadLetters(Protocol):
    """Where quarantined entries go, with their error. ``put`` is idempotent by entry ID."""

    def put(
        self, aggregate_id: AggregateId, entry: dict[str, Any], error: str, attempts: int
    ) -> None: ...
