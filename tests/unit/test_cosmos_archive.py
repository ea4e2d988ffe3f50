"""The Cosmos DB inbox archive passes the spill's session token from write to read."""

from __future__ import annotations

from typing import Any

from azure.cosmos import exceptions as cosmos_errors

from docoutbox_cosmos.archive import CosmosInboxArchive, item_id, lookup_query


class FakeContainer:
    """Items in a dict; every response carries the next session token."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.lsn = 0
        self.batches = 0
        self.reads: list[dict[str, Any]] = []

    def execute_item_batch(
        self, batch: list[tuple[str, tuple[Any, ...]]], partition_key: str, response_hook: Any
    ) -> list[Any]:
        assert len(batch) <= 100
        for kind, (body,) in batch:
            assert kind == "upsert" and body["pk"] == partition_key
            self.items[(body["pk"], body["id"])] = body
        self.lsn += 1
        self.batches += 1
        response_hook({"x-ms-session-token": f"0:1#{self.lsn}"}, [])
        return []

    def read_item(self, item: str, partition_key: str, **kwargs: Any) -> dict[str, Any]:
        self.reads.append(kwargs)
        try:
            return self.items[(partition_key, item)]
        except KeyError:
            raise cosmos_errors.CosmosResourceNotFoundError(status_code=404) from None

    def query_items(self, sql: str, **kwargs: Any) -> list[dict[str, Any]]:
        self.reads.append(kwargs)
        pk = kwargs["partition_key"]
        wanted = kwargs["parameters"][1]["value"]
        return [
            {"message_id": i["message_id"]}
            for (p, _), i in self.items.items()
            if p == pk and i["message_id"] in wanted
        ]


def test_the_write_returns_its_last_session_token_and_reads_pass_it_on() -> None:
    container = FakeContainer()
    archive = CosmosInboxArchive(container, lambda aggregate_id: f"pk-{aggregate_id}")
    token = archive.archive("a", ["m1", "m2", "m1"])
    assert token == "0:1#1" and container.batches == 1  # the duplicate ID is written once
    assert archive.archived("a", ["m1"], token) == {"m1"}
    assert archive.archived("a", ["m3"], token) == set()
    assert archive.archived("a", ["m1", "m2", "m3"], token) == {"m1", "m2"}
    assert archive.archived("b", ["m1", "m2"], None) == set()
    assert [r.get("session_token") for r in container.reads] == [token, token, token, None]
    many = archive.archive("b", [f"n{i}" for i in range(250)])
    assert many == "0:1#4" and container.batches == 4  # 100 + 100 + 50 IDs
    assert len(archive.archived("b", [f"n{i}" for i in range(250)], many)) == 250


def test_items_are_named_by_a_hash_of_the_message_id() -> None:
    assert item_id("a/b?c#d") == item_id("a/b?c#d")
    assert len(item_id("x" * 512)) == 64 and "/" not in item_id("a/b")
    sql, parameters = lookup_query("pk", ["m1"])
    assert "c.pk = @pk" in sql and parameters[1] == {"name": "@ids", "value": ["m1"]}
