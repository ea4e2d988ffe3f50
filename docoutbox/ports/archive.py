"""The inbox archive: where a spilling inbox keeps the IDs that left its window.

Rule: an optional capability of a store backend, checked once when a store is built
with ``InboxPolicy(spill=True)`` (:func:`check_archive`). The store writes IDs before the
commit that removes them from the document, and reads them after it read the document
(:mod:`docoutbox.store.spill`); the archive only has to make a finished write visible to
a later read that passes the write's token.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol, runtime_checkable

from docoutbox.errors import InvalidConfig
from docoutbox.model import AggregateId


@runtime_checkable
class InboxArchive(Protocol):
    """Optional: a sync store backend that archives spilled inbox IDs."""

    def archive_inbox(self, aggregate_id: AggregateId, ids: Collection[str]) -> str | None:
        """Upsert ``ids`` for ``aggregate_id`` (idempotent). Returns a token that makes a
        later :meth:`archived_inbox` see this write (None: every read sees it)."""
        ...

    def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]:
        """Which of ``ids`` are archived for ``aggregate_id``, in one read."""
        ...


@runtime_checkable
class AsyncInboxArchive(Protocol):
    """The async twin of :class:`InboxArchive`."""

    async def archive_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str]
    ) -> str | None: ...

    async def archived_inbox(
        self, aggregate_id: AggregateId, ids: Collection[str], token: str | None = None
    ) -> set[str]: ...


def check_archive(backend: object, spill: bool) -> None:
    """Refuse a spilling inbox policy on a backend without an inbox archive. A backend
    whose archive is optional says whether it has one in ``has_inbox_archive``."""
    if not spill:
        return
    if not isinstance(backend, InboxArchive | AsyncInboxArchive) or not getattr(
        backend, "has_inbox_archive", True
    ):
        raise InvalidConfig(
            f"InboxPolicy(spill=True) needs a backend with an inbox archive "
            f"(docoutbox.ports.archive.InboxArchive); {type(backend).__name__} has none"
        )
