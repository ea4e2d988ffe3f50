"""What a store adapter must provide. Adapters execute plans; they decide nothing.

A store backend has a sync and an async twin with the same methods. The store's logic
lives in :mod:`docoutbox.store.core` and is driven against either twin.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from docoutbox.model import AggregateId
from docoutbox.store.document import Document
from docoutbox.store.plans import WritePlan


@runtime_checkable
class DispatchBackend(Protocol):
    """What a dispatcher uses of a :class:`StoreBackend`: ``load``, ``write`` and
    ``find_pending`` (sync or async alike)."""

    def load(self, aggregate_id: AggregateId) -> Any: ...

    def write(self, plan: WritePlan) -> Any: ...

    def find_pending(
        self,
        *,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None = None,
        partitions: Collection[int] | None = None,
    ) -> Any: ...


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

        ``older_than`` keeps only those whose oldest pending entry was created before it;
        a scheduled entry counts from its due time instead, once that is also before it
        (a periodic sweep then leaves documents whose entries wait for later to the due
        query). A backend that counts scheduled entries from their creation only makes
        its sweeps run such documents for nothing.
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
class DueBackend(Protocol):
    """Optional: a store backend (sync or async alike) that finds documents whose
    scheduled entries fell due, by an index on their ``earliest_due`` hint.

    ``find_due`` returns (or, async, resolves to) the documents whose ``earliest_due`` is
    at or before ``due_before``, in ``_id`` order strictly after ``after``, at most
    ``limit``, in ``partitions`` when given. Without it, a dispatcher publishes scheduled
    entries only when a sweep or a change brings their document after they fell due.
    """

    def find_due(
        self,
        *,
        due_before: datetime,
        after: AggregateId | None,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> Any: ...


@runtime_checkable
class BatchWriter(Protocol):
    """Optional: a :class:`StoreBackend` that writes several plans in one round trip.

    ``write_many`` returns one result per plan, in order, each as :meth:`StoreBackend.write`
    would. The dispatcher groups the trims of concurrent runs through it; without it, each
    run writes its own trim.
    """

    def write_many(self, plans: Sequence[WritePlan]) -> list[bool]: ...


@runtime_checkable
class AsyncBatchWriter(Protocol):
    """The async twin of :class:`BatchWriter`."""

    async def write_many(self, plans: Sequence[WritePlan]) -> list[bool]: ...
