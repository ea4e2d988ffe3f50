"""Hooks a store calls while handling, so tracing and metrics stay outside the core.

Rule: the store imports no telemetry SDK. It calls a :class:`StoreObserver` set in
:class:`~docoutbox.store.core.StoreConfig` (``observer=``), which may:

- wrap each ``handle`` call (``handling``: a context manager entered around the whole
  call, on the caller's thread or task; a tracer opens the handling span there);
- add headers to every entry a commit emits (``headers``: called while the handling
  context is active, with the incoming message; a tracer injects ``traceparent`` and
  ``tracestate`` there). Headers the handler set itself win;
- count what the store does (``conflict``: a conditional write lost a race; ``retry``: an
  attempt is being repeated after a conflict or a transient error).

:mod:`docoutbox.otel` implements it with OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from docoutbox.model import AggregateId, Message


@runtime_checkable
class StoreObserver(Protocol):
    def handling(
        self, aggregate_type: str, aggregate_id: AggregateId, message: Message
    ) -> AbstractContextManager[object]: ...

    def headers(self, message: Message) -> Mapping[str, str]: ...

    def conflict(self, aggregate_type: str) -> None: ...

    def retry(self, aggregate_type: str, reason: str) -> None: ...


def with_headers(entries: list[dict[str, Any]], extra: Mapping[str, str]) -> list[dict[str, Any]]:
    """``entries`` with ``extra`` headers added (an entry's own headers win)."""
    if not extra:
        return entries
    out = []
    for entry in entries:
        own = entry.get("headers")
        merged = {**extra, **(own if isinstance(own, dict) else {})}
        out.append({**entry, "headers": merged})
    return out
