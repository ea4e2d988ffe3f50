"""Immediate dispatch on asyncio: the same rules as the threaded path (test_immediate.py),
with the worker, the store and the regular dispatcher on one event loop."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox import AggregateStore, AsyncAggregateStore, OutboxMessage
from docoutbox.dispatch.extras.immediate import AsyncImmediateDispatcher
from docoutbox.dispatch.extras.settled import AsyncSettledPublisher
from docoutbox.errors import InvalidConfig
from docoutbox.testing import MemoryBackend
from docoutbox.testing.contract import Counter
from docoutbox.testing.memory import AsyncMemoryBackend
from docoutbox.testing.publisher import AsyncMemoryPublisher


class SyncPublisher:
    def publish(self, entry: OutboxMessage) -> None:
        return None


@pytest.mark.parametrize(
    "build",
    [
        lambda store, pub: AsyncImmediateDispatcher(AggregateStore(MemoryBackend(), Counter), pub),
        lambda store, pub: AsyncImmediateDispatcher(store, SyncPublisher()),
        lambda store, pub: AsyncImmediateDispatcher(store, None),
        lambda store, pub: AsyncImmediateDispatcher(store, pub, max_batch=0),
        lambda store, pub: AsyncImmediateDispatcher(store, pub, max_queue=-1),
        lambda store, pub: AsyncImmediateDispatcher(store, pub, max_queue=2**31),
        lambda store, pub: AsyncSettledPublisher(SyncPublisher(), AsyncMemoryBackend()),
        lambda store, pub: AsyncSettledPublisher(pub, AsyncMemoryBackend(), float("nan")),
        lambda store, pub: AsyncSettledPublisher(pub, AsyncMemoryBackend(), -1.0),
    ],
    ids=[
        "sync-store",
        "sync-publisher",
        "no-publisher",
        "batch-0",
        "queue-neg",
        "queue-huge",
        "settled-sync-publisher",
        "settle-nan",
        "settle-negative",
    ],
)
def test_async_immediate_dispatch_refuses_arguments_it_cannot_use(build: Any) -> None:
    store = AsyncAggregateStore(AsyncMemoryBackend(), Counter)
    with pytest.raises(InvalidConfig):
        build(store, AsyncMemoryPublisher())
