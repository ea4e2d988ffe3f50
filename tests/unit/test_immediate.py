"""Immediate dispatch: entries published right after their commit; the regular dispatcher
remains the safety net, and in one process the two paths do not publish an entry twice."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from docoutbox import AggregateStore, OutboxMessage
from docoutbox.dispatch.extras.immediate import ImmediateDispatcher
from docoutbox.dispatch.extras.settled import SettledPublisher
from docoutbox.errors import InvalidConfig
from docoutbox.testing import MemoryBackend, MemoryPublisher
from docoutbox.testing.contract import Counter, add_msg, counter_handlers


def pending(backend: MemoryBackend) -> int:
    return sum(len(doc.get("outbox") or []) for doc in backend.docs.values())


def one_trimmed_one_pending(backend: MemoryBackend) -> tuple[OutboxMessage, OutboxMessage]:
    """Two young entries of one commit: the first published and trimmed by the immediate
    path, the second still pending."""
    store = AggregateStore(backend, Counter)
    first, second = store.handle("a", add_msg("m1", emits=2), counter_handlers, create=True).emitted
    store.trim("a", [first.id])
    return first, second


def test_settled_publisher_skips_young_entries_the_immediate_path_trimmed() -> None:

    backend = MemoryBackend()
    first, second = one_trimmed_one_pending(backend)
    inner = MemoryPublisher()
    slept: list[float] = []
    settled = SettledPublisher(inner, backend, 0.5, sleep=slept.append)
    settled.publish(first)
    settled.publish(second)
    assert inner.ids() == [second.id] and settled.skipped == 1
    assert len(slept) == 2 and all(0 < s <= 0.5 for s in slept)
    old = SettledPublisher(
        inner, backend, 0.5, clock=lambda: first.created_at + timedelta(seconds=5)
    )
    old.publish(first)  # old enough: published without a look (at least once)
    assert inner.ids() == [second.id, first.id]


@pytest.mark.parametrize(
    "build",
    [
        lambda store, pub: ImmediateDispatcher(None, pub),  # accepted, then AttributeError
        lambda store, pub: ImmediateDispatcher(store, None),
        lambda store, pub: ImmediateDispatcher(store, pub, max_batch=0),
        lambda store, pub: ImmediateDispatcher(store, pub, max_queue=-1),
        lambda store, pub: ImmediateDispatcher(store, pub, max_batch=2**31),
        lambda store, pub: ImmediateDispatcher(store, pub, max_queue=2**31),
        lambda store, pub: SettledPublisher(pub, MemoryBackend(), float("nan")),
        lambda store, pub: SettledPublisher(pub, MemoryBackend(), -1.0),
        lambda store, pub: SettledPublisher(object(), MemoryBackend()),
    ],
    ids=[
        "no-store",
        "no-publisher",
        "batch-0",
        "queue-neg",
        "batch-huge",
        "queue-huge",
        "settle-nan",
        "settle-neg",
        "no-publish",
    ],
)
def test_immediate_dispatch_refuses_arguments_it_cannot_use(build: Any) -> None:
    store = AggregateStore(MemoryBackend(), Counter)
    with pytest.raises(InvalidConfig):
        build(store, MemoryPublisher())
