"""A stored ``outbox_seq`` that is not a sequence number, on the wire server: the store
refuses to commit on it with a typed error and leaves the document as it was (the memory
backend's cases are in ``tests/unit/test_outbox_seq.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from benchmarks.servers import MongoWireServer
from docoutbox import AggregateStore, Message, StoreConfig
from docoutbox.errors import MalformedDocument
from docoutbox.testing.contract import Counter, counter_handlers
from docoutbox_mongo import MongoBackend

pytestmark = pytest.mark.wire


@pytest.fixture
def collection(wire_server: MongoWireServer) -> Iterator[Any]:
    client: Any = MongoClient(wire_server.uri, uuidRepresentation="standard")
    name = f"t_{uuid.uuid4().hex[:12]}"
    database = client["docoutbox_test"]
    try:
        yield database[name]
    finally:
        database.drop_collection(name)
        client.close()


@pytest.mark.parametrize("value", ["3", True, 2.5, -1])
def test_a_commit_on_a_stored_outbox_seq_that_is_not_a_sequence_number_is_refused(
    collection: Any, value: Any
) -> None:
    store = AggregateStore(MongoBackend(collection), Counter, StoreConfig(cache_size=0))
    store.handle(
        "c-1", Message(id="m-1", type="Add", payload={"n": 1}), counter_handlers, create=True
    )
    collection.update_one({"_id": "c-1"}, {"$set": {"outbox_seq": value}})
    before = collection.find_one({"_id": "c-1"})
    with pytest.raises(MalformedDocument, match="outbox_seq"):
        store.handle("c-1", Message(id="m-2", type="Add", payload={"n": 1}), counter_handlers)
    assert collection.find_one({"_id": "c-1"}) == before
