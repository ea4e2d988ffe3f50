"""An in-memory publisher and dead-letter store, with scriptable failures."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.stored.reference import claim_of

#: Decides, per entry, whether to fail: return an exception to raise, or None to accept.
FailureRule = Callable[[OutboxMessage], BaseException | None]


class MemoryPublisher:
    """Records every accepted entry in ``published``, in publish order. Thread-safe."""

    def __init__(self, fail: FailureRule | None = None) -> None:
        self.published: list[OutboxMessage] = []
        self.fail = fail
        self._lock = threading.Lock()

    def publish(self, entry: OutboxMessage) -> None:
        if self.fail is not None:
            error = self.fail(entry)
            if error is not None:
                raise error
        with self._lock:
            self.published.append(entry)

    def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        """One outcome per entry, in order, each as :meth:`publish` gives it (a
        :class:`~docoutbox.ports.dispatch.PipelinedPublisher`: a dispatcher publishes to
        memory in rounds, as it does to a broker that pipelines)."""
        outcomes: list[Exception | None] = []
        for entry in entries:
            try:
                self.publish(entry)
            except Exception as exc:  # noqa: BLE001 - this entry's outcome, reported in order
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes

    def ids(self) -> list[str]:
        with self._lock:
            return [entry.id for entry in self.published]


class AsyncMemoryPublisher:
    """The async twin of :class:`MemoryPublisher`, sharing its record."""

    def __init__(self, sync: MemoryPublisher | None = None) -> None:
        self.sync = sync or MemoryPublisher()

    async def publish(self, entry: OutboxMessage) -> None:
        self.sync.publish(entry)

    async def publish_many(self, entries: Sequence[OutboxMessage]) -> list[Exception | None]:
        return self.sync.publish_many(entries)


class MemoryDeadLetters:
    """Quarantined entries by entry ID (or a fallback key for entries without one)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def put(
        self,
        aggregate_id: AggregateId | None,
        entry: dict[str, Any],
        error: str,
        attempts: int,
        *,
        origin: str = "dispatch",
        queue: str | None = None,
        body: str | bytes | None = None,
    ) -> None:
        """Also a consumer's :class:`~docoutbox.receive.Rejects` (``origin="consume"``)."""
        key = str(
            entry.get("id") or f"{aggregate_id if aggregate_id is not None else queue}/{entry!r}"
        )
        with self._lock:
            self.entries.setdefault(
                key,
                {
                    "aggregate_id": aggregate_id,
                    "entry": entry,
                    "error": error,
                    "attempts": attempts,
                    "origin": origin,
                    "queue": queue,
                    "body": body,
                },
            )

    def refers_to(self, payload_id: str) -> bool:
        """Whether a dead letter holds a claim-checked entry with that payload."""
        with self._lock:
            letters = list(self.entries.values())
        return any((claim_of(d["entry"]) or {}).get("id") == payload_id for d in letters)
