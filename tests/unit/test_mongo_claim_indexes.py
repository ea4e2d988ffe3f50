"""The claim check's queries on MongoDB read by an index: every filter the payload store
and the dead letters send (the orphan sweep's, the dispatcher's) names only fields of one
of the indexes ``ensure_indexes`` creates, led by the index's first key, and the sweep's
listing sorts by it; an aggregate store with a claim check creates its payload store's
indexes in its own ``ensure_indexes`` (on mongomock and mongomock-motor here). The
indexes' existence on the wire server is checked in
``tests/integration/test_mongo_claim_indexes.py``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import mongomock
import pytest
from mongomock_motor import AsyncMongoMockClient

from docoutbox import AggregateStore, AsyncAggregateStore, StoreConfig
from docoutbox.errors import InvalidConfig
from docoutbox.ports.payloads import PayloadInfo
from docoutbox.stored.chunks import manifest
from docoutbox.stored.claim import ClaimCheck
from docoutbox.testing.contract import Counter
from docoutbox.testing.payloads import MemoryPayloads
from docoutbox_mongo import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.coordination import DEAD_LETTER_INDEXES, MongoDeadLetters
from docoutbox_mongo.payloads import INDEXES, AsyncMongoPayloads, MongoPayloads
from tests.support.loopless import run

Index = tuple[str, list[tuple[str, int]], dict[str, Any]]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
INFO = PayloadInfo("p-1", "a", "e-1", 0, NOW - timedelta(hours=2), "g-1")
#: One empty payload's finished manifest, all a payload collection holds here.
HEAD = {"_id": INFO.payload_id, "kind": "manifest", **manifest(INFO, 0, True)}


class Result:
    matched_count = deleted_count = 1


class Cursor(list[dict[str, Any]]):
    def __init__(self, docs: Iterable[dict[str, Any]], sorts: list[str]) -> None:
        super().__init__(docs)
        self.sorts = sorts

    def sort(self, key: str, direction: int) -> Cursor:
        self.sorts.append(key)
        return self

    def limit(self, count: int) -> Cursor:
        return self


class Recording:
    """A collection that records every filter it is sent and every created index."""

    def __init__(self) -> None:
        self.filters: list[dict[str, Any]] = []
        self.sorts: list[str] = []
        self.created: list[tuple[list[tuple[str, int]], dict[str, Any]]] = []

    def create_index(self, keys: list[tuple[str, int]], **options: Any) -> str:
        self.created.append((keys, options))
        return str(options["name"])

    def find(self, query: dict[str, Any], *projection: Any) -> Cursor:
        self.filters.append(query)
        return Cursor([] if "p" in query else [HEAD], self.sorts)

    def find_one(self, query: dict[str, Any], *projection: Any) -> dict[str, Any] | None:
        self.filters.append(query)
        return HEAD if query.get("_id") == INFO.payload_id else None

    def delete_one(self, query: dict[str, Any]) -> Result:
        self.filters.append(query)
        return Result()

    def delete_many(self, query: dict[str, Any]) -> Result:
        self.filters.append(query)
        return Result()


def fields(query: dict[str, Any]) -> set[str]:
    """The document fields a filter reads (through ``$or``/``$and`` too)."""
    named: set[str] = set()
    for key, value in query.items():
        if key in ("$or", "$and"):
            for part in value:
                named |= fields(part)
        else:
            named.add(key)
    return named


def served(query: dict[str, Any], indexes: Iterable[Index], sort: str | None = None) -> bool:
    """Whether ``query`` reads by ``_id`` or by one of ``indexes``: led by its first key,
    every other field in its keys or its partial filter (matched by the query)."""
    if "_id" in query:
        return True
    for _, keys, options in indexes:
        names = [name for name, _ in keys]
        partial = options.get("partialFilterExpression", {})
        if names[0] not in query or any(query.get(k) != v for k, v in partial.items()):
            continue
        if fields(query) <= {*names, *partial} and (sort is None or sort in names):
            return True
    return False


def test_every_query_of_the_payload_store_reads_by_an_index() -> None:
    collection = Recording()
    payloads = MongoPayloads(collection)
    [listed] = payloads.stale(NOW - timedelta(hours=1), 100)  # the sweep
    assert payloads.delete_stale(listed)
    assert payloads.get(INFO.payload_id) == b""  # the dispatcher, the consumers
    payloads.delete([INFO.payload_id])
    by_id = [q for q in collection.filters if "_id" in q]
    others = [q for q in collection.filters if "_id" not in q]
    assert len(by_id) == 3 and len(others) == 4
    [listing] = [q for q in others if "stored_at" in q]
    assert served(listing, INDEXES, sort=collection.sorts[0]), listing
    for query in others:
        assert served(query, INDEXES), query


def test_the_dead_letters_are_asked_for_a_payload_by_an_index() -> None:
    collection = Recording()
    assert not MongoDeadLetters(collection).refers_to("p-1")
    [query] = collection.filters
    assert served(query, DEAD_LETTER_INDEXES), query
    assert not served(query, INDEXES)  # the check can fail


def test_ensure_indexes_creates_each_index_by_name() -> None:
    payloads, letters = Recording(), Recording()
    MongoPayloads(payloads).ensure_indexes()
    MongoDeadLetters(letters).ensure_indexes()
    assert [(k, o["name"]) for k, o in payloads.created] == [(k, n) for n, k, _ in INDEXES]
    assert [(k, o["name"]) for k, o in letters.created] == [
        (k, n) for n, k, _ in DEAD_LETTER_INDEXES
    ]


def claim_checked(payloads: Any) -> StoreConfig:
    return StoreConfig(claim_check=ClaimCheck(payloads))


def payload_indexes(information: dict[str, Any]) -> list[tuple[str, list[tuple[str, int]]]]:
    """The claim check's indexes among a collection's ``index_information()``."""
    return [(name, information[name]["key"]) for name, _, _ in INDEXES if name in information]


EXPECTED = [(name, keys) for name, keys, _ in INDEXES]


def test_the_store_creates_its_claim_checks_indexes_with_the_collections() -> None:
    db = mongomock.MongoClient()["shop"]
    store = AggregateStore(
        MongoBackend(db["carts"]), Counter, claim_checked(MongoPayloads(db["carts_payloads"]))
    )
    store.ensure_indexes()
    store.ensure_indexes()  # idempotent
    assert payload_indexes(db["carts_payloads"].index_information()) == EXPECTED
    assert "docoutbox_due" in db["carts"].index_information()
    stale = db["carts_payloads"].index_information()["docoutbox_payload_stale"]
    assert stale["partialFilterExpression"] == {"kind": "manifest"}


def test_the_async_store_creates_them_too() -> None:
    db = AsyncMongoMockClient()["shop"]
    store = AsyncAggregateStore(
        AsyncMongoBackend(db["carts"]),
        Counter,
        claim_checked(AsyncMongoPayloads(db["carts_payloads"])),
    )
    run(store.ensure_indexes())
    assert payload_indexes(run(db["carts_payloads"].index_information())) == EXPECTED
    assert "docoutbox_due" in run(db["carts"].index_information())


def test_a_payload_store_without_indexes_is_left_alone() -> None:
    """A payload store without ``ensure_indexes`` (memory, Cosmos DB) has none to make."""
    db = mongomock.MongoClient()["shop"]
    store = AggregateStore(MongoBackend(db["carts"]), Counter, claim_checked(MemoryPayloads()))
    store.ensure_indexes()
    assert "docoutbox_due" in db["carts"].index_information()


def test_a_payload_store_whose_ensure_indexes_is_of_the_other_kind_is_refused() -> None:
    class Mixed(MemoryPayloads):
        async def ensure_indexes(self) -> None:
            """An async set-up on a sync payload store."""

    db = mongomock.MongoClient()["shop"]
    with pytest.raises(InvalidConfig, match=r"Mixed\.ensure_indexes must be sync"):
        AggregateStore(MongoBackend(db["carts"]), Counter, claim_checked(Mixed()))
