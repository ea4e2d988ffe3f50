"""A stored ``outbox_seq`` that is not a sequence number (a plain non-negative int) is a
typed error on the store's path: a commit never numbers entries from a coerced ``"3"``,
``True`` or ``2.5``, and writes nothing. The dispatcher's side (a due entry on such a
document is quarantined) is in ``test_scheduled.py``."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox import AggregateStore, AsyncAggregateStore, Message, StoreConfig
from docoutbox.errors import MalformedDocument
from docoutbox.store.batch import Failed
from docoutbox.store.document import is_sequence_number, read_snapshot
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.contract import Counter, counter_handlers
from tests.support import loopless

#: No cache: every handle reads the document as stored.
UNCACHED = StoreConfig(cache_size=0)
CORRUPT = ["3", True, False, 2.5, 3.0, -1, None, [3]]


def add(message_id: str) -> Message:
    return Message(id=message_id, type="Add", payload={"n": 1})


def corrupted(backend: MemoryBackend, value: Any) -> None:
    backend.docs["c-1"]["outbox_seq"] = value


@pytest.mark.parametrize("value", CORRUPT)
@pytest.mark.parametrize("group_commit", [False, True])
@pytest.mark.parametrize("batch", [False, True])
def test_a_commit_on_a_document_whose_outbox_seq_is_not_a_sequence_number_is_refused(
    value: Any, group_commit: bool, batch: bool
) -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter, UNCACHED, group_commit=group_commit)
    store.handle("c-1", add("m-1"), counter_handlers, create=True)
    corrupted(backend, value)
    writes = len(backend.changes)
    if batch:
        [failed] = store.handle_batch("c-1", [add("m-2")], counter_handlers).results
        assert isinstance(failed, Failed)
        assert isinstance(failed.error, MalformedDocument)
        assert "outbox_seq" in str(failed.error)
    else:
        with pytest.raises(MalformedDocument, match="outbox_seq"):
            store.handle("c-1", add("m-2"), counter_handlers)
    assert len(backend.changes) == writes
    assert backend.docs["c-1"]["outbox_seq"] is value


@pytest.mark.parametrize("value", CORRUPT)
def test_an_async_store_refuses_it_too(value: Any) -> None:
    backend = AsyncMemoryBackend()
    store = AsyncAggregateStore(backend, Counter, UNCACHED)

    async def run() -> None:
        await store.handle("c-1", add("m-1"), counter_handlers, create=True)
        corrupted(backend.sync, value)
        with pytest.raises(MalformedDocument, match="outbox_seq"):
            await store.handle("c-1", add("m-2"), counter_handlers)

    loopless.run(run())
    assert len(backend.sync.changes) == 1


@pytest.mark.parametrize("value", CORRUPT)
def test_reading_the_aggregate_names_the_document_and_the_value(value: Any) -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    store.handle("c-1", add("m-1"), counter_handlers, create=True)
    corrupted(backend, value)
    with pytest.raises(MalformedDocument) as raised:
        read_snapshot(backend.docs["c-1"], Counter)
    assert f"'c-1' has outbox_seq {value!r}," in str(raised.value)


def test_an_absent_outbox_seq_reads_as_zero_and_a_sequence_number_as_itself() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter, UNCACHED)
    store.handle("c-1", add("m-1"), counter_handlers, create=True)
    del backend.docs["c-1"]["outbox_seq"]
    assert read_snapshot(backend.docs["c-1"], Counter).outbox_seq == 0
    backend.docs["c-1"]["outbox_seq"] = 7
    store.handle("c-1", add("m-2"), counter_handlers)
    assert backend.docs["c-1"]["outbox_seq"] == 8
    assert backend.docs["c-1"]["outbox"][-1]["seq"] == 8


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, True), (5, True), (2**40, True), (-1, False), (True, False), (2.0, False), ("1", False)],
)
def test_what_is_a_sequence_number(value: Any, expected: bool) -> None:
    assert is_sequence_number(value) is expected
