"""The Cosmos DB behaviour docoutbox relies on, pinned through the azure-cosmos SDK.

Runs on the local patched server, or on a real account (or the official emulator) when
``COSMOS_ENDPOINT``/``COSMOS_KEY`` are set. Each test creates its own database and
container with unique names and deletes only those.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.cosmos import PartitionKey, exceptions

from tests.support.servers import CosmosAccount

pytestmark = pytest.mark.cosmos


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def container(cosmos_server: CosmosAccount) -> Iterator[Any]:
    client = cosmos_server.client()
    database = client.create_database(_name("docoutbox_sdk"))
    try:
        yield database.create_container(_name("c"), PartitionKey(path="/pk"))
    finally:
        client.delete_database(database.id)
        client.close()


def test_create_duplicate_is_409(container: Any) -> None:
    container.create_item({"id": "a", "pk": "p"})
    with pytest.raises(exceptions.CosmosResourceExistsError) as err:
        container.create_item({"id": "a", "pk": "p"})
    assert err.value.status_code == 409


def test_replace_with_stale_etag_is_412(container: Any) -> None:
    first = container.create_item({"id": "a", "pk": "p", "n": 0})
    container.replace_item("a", {"id": "a", "pk": "p", "n": 1})
    with pytest.raises(exceptions.CosmosAccessConditionFailedError) as err:
        container.replace_item(
            "a",
            {"id": "a", "pk": "p", "n": 2},
            etag=first["_etag"],
            match_condition=MatchConditions.IfNotModified,
        )
    assert err.value.status_code == 412
    assert container.read_item("a", partition_key="p")["n"] == 1
