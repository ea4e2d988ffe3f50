"""Trims of concurrent runs go out together (group commit), in one ``bulk_write``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import mongomock
import pytest

from docoutbox import AggregateStore
from docoutbox.dispatch.drivers.operations import GroupWriter
from docoutbox.store.plans import TrimPlan, WritePlan, plan_trim
from docoutbox.testing import MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_mongo import MongoBackend


def test_a_failed_batch_fails_every_writer_in_it() -> None:
    class Broken:
        def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
            raise RuntimeError("down")

    with pytest.raises(RuntimeError, match="down"):
        GroupWriter(Broken()).write(plan_trim("a", ["e"]))


def stored(backend: Any, aggregates: int) -> dict[str, list[str]]:
    store = AggregateStore(backend, Counter)
    ids = {}
    for i in range(aggregates):
        outcome = store.handle(f"a{i}", add_msg(f"m{i}", emits=2), counter_handlers, create=True)
        ids[f"a{i}"] = [e.id for e in outcome.emitted]
    return ids


def test_a_backend_without_write_many_is_written_plan_by_plan() -> None:
    backend = MemoryBackend()
    ids = stored(backend, 3)
    writer = GroupWriter(backend)
    assert writer.write(plan_trim("a0", ids["a0"][:1])) is True
    assert [e["id"] for e in backend.docs["a0"]["outbox"]] == ids["a0"][1:]


def trims(ids: dict[str, list[str]]) -> list[TrimPlan]:
    return [plan_trim(a, entries[:1]) for a, entries in ids.items()]


def test_mongomock_bulk_write_falls_back_to_one_write_per_plan() -> None:

    backend = MongoBackend(mongomock.MongoClient()["t"][uuid.uuid4().hex])
    ids = stored(backend, 3)
    assert backend.write_many(trims(ids)) == [True] * 3
    for aggregate, entries in ids.items():
        assert [e["id"] for e in backend.load(aggregate)["outbox"]] == entries[1:]
