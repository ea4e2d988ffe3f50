"""The Cosmos DB behaviour docoutbox relies on, pinned through the azure-cosmos SDK.

Runs on the local patched server, or on a real account (or the official emulator) when
``COSMOS_ENDPOINT``/``COSMOS_KEY`` are set, through the sync SDK and ``azure.cosmos.aio``
alike: every scenario is written once against the small ``Api`` facade below. Each test
creates its own database and container with unique names and deletes only those.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.cosmos import PartitionKey, exceptions

from benchmarks.servers import CosmosAccount

pytestmark = pytest.mark.cosmos


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class Api:
    """One container through the sync SDK; ``AioApi`` is the same through azure.cosmos.aio."""

    def __init__(self, container: Any, emulated: bool) -> None:
        self.c = container
        self.emulated = emulated
        self.statuses: list[int] = []  # HTTP status of every change feed request

    def _hook(self, response: Any) -> None:
        self.statuses.append(response.http_response.status_code)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.c.create_item(body))

    async def upsert(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.c.upsert_item(body))

    async def read(self, item: str, pk: Any) -> dict[str, Any]:
        return dict(self.c.read_item(item, partition_key=pk))

    async def replace(self, item: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return dict(self.c.replace_item(item, body, **kw))

    async def patch(self, item: str, pk: Any, ops: list[dict[str, Any]], **kw: Any) -> Any:
        return self.c.patch_item(item, partition_key=pk, patch_operations=ops, **kw)

    async def delete(self, item: str, pk: Any) -> None:
        self.c.delete_item(item, partition_key=pk)

    async def batch(self, ops: list[Any], pk: Any) -> list[dict[str, Any]]:
        return list(self.c.execute_item_batch(ops, partition_key=pk))

    async def query(self, sql: str, params: list[dict[str, Any]], **kw: Any) -> list[Any]:
        if "partition_key" not in kw:
            kw["enable_cross_partition_query"] = True
        return list(self.c.query_items(sql, parameters=params, **kw))

    async def feed_ranges(self) -> list[dict[str, Any]]:
        return list(self.c.read_feed_ranges())

    async def feed_range_for(self, pk: Any) -> dict[str, Any]:
        return dict(self.c.feed_range_from_partition_key(pk))

    async def is_subset(self, parent: dict[str, Any], child: dict[str, Any]) -> bool:
        return bool(self.c.is_feed_range_subset(parent, child))

    async def feed_page(self, **kw: Any) -> tuple[list[dict[str, Any]], str]:
        """One page of the change feed and the continuation to resume after it."""
        pages = self.c.query_items_change_feed(raw_response_hook=self._hook, **kw).by_page()
        try:
            items = list(next(pages))
        except StopIteration:
            items = []
        return items, self._continuation(pages)

    def _continuation(self, pages: Any) -> str:
        # With no page at all the pager's token is None: the SDK leaves the continuation in
        # the last response's etag header instead.
        token = pages.continuation_token or self.c.client_connection.last_response_headers["etag"]
        assert isinstance(token, str)
        return token

    async def feed_all(self, **kw: Any) -> list[dict[str, Any]]:
        return list(self.c.query_items_change_feed(raw_response_hook=self._hook, **kw))


class AioApi(Api):
    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(await self.c.create_item(body))

    async def upsert(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(await self.c.upsert_item(body))

    async def read(self, item: str, pk: Any) -> dict[str, Any]:
        return dict(await self.c.read_item(item, partition_key=pk))

    async def replace(self, item: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return dict(await self.c.replace_item(item, body, **kw))

    async def patch(self, item: str, pk: Any, ops: list[dict[str, Any]], **kw: Any) -> Any:
        return await self.c.patch_item(item, partition_key=pk, patch_operations=ops, **kw)

    async def delete(self, item: str, pk: Any) -> None:
        await self.c.delete_item(item, partition_key=pk)

    async def batch(self, ops: list[Any], pk: Any) -> list[dict[str, Any]]:
        return list(await self.c.execute_item_batch(ops, partition_key=pk))

    async def query(self, sql: str, params: list[dict[str, Any]], **kw: Any) -> list[Any]:
        return [item async for item in self.c.query_items(sql, parameters=params, **kw)]

    async def feed_ranges(self) -> list[dict[str, Any]]:
        return [r async for r in self.c.read_feed_ranges()]

    async def feed_range_for(self, pk: Any) -> dict[str, Any]:
        return dict(await self.c.feed_range_from_partition_key(pk))

    async def is_subset(self, parent: dict[str, Any], child: dict[str, Any]) -> bool:
        return bool(await self.c.is_feed_range_subset(parent, child))

    async def feed_page(self, **kw: Any) -> tuple[list[dict[str, Any]], str]:
        pages = self.c.query_items_change_feed(raw_response_hook=self._hook, **kw).by_page()
        try:
            page = await pages.__anext__()
            items = [item async for item in page]
        except StopAsyncIteration:
            items = []
        return items, self._continuation(pages)

    async def feed_all(self, **kw: Any) -> list[dict[str, Any]]:
        feed = self.c.query_items_change_feed(raw_response_hook=self._hook, **kw)
        return [item async for item in feed]


Scenario = Callable[[Api], Awaitable[None]]


@pytest.fixture(params=["sync", "aio"])
def run(request: pytest.FixtureRequest, cosmos_server: CosmosAccount) -> Any:
    """Runs a scenario on a fresh container (partition key ``/pk``), sync or aio."""
    flavour: str = request.param
    account = cosmos_server

    def runner(scenario: Scenario) -> None:
        db_name = _name("docoutbox_sdk")
        if flavour == "sync":
            with account.client() as client:
                database = client.create_database(db_name)
                try:
                    container = database.create_container(_name("c"), PartitionKey(path="/pk"))
                    asyncio.run(scenario(Api(container, account.emulated)))
                finally:
                    client.delete_database(db_name)
            return

        async def main() -> None:
            async with account.async_client() as client:
                database = await client.create_database(db_name)
                try:
                    container = await database.create_container(
                        _name("c"), PartitionKey(path="/pk")
                    )
                    await scenario(AioApi(container, account.emulated))
                finally:
                    await client.delete_database(db_name)

        asyncio.run(main())

    return runner


# --- point operations ---------------------------------------------------------------------


def test_missing_item_is_404_for_read_replace_patch_delete(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "other", "pk": "p"})
        attempts: list[Callable[[], Awaitable[Any]]] = [
            lambda: api.read("absent", "p"),
            lambda: api.read("other", "another-partition"),
            lambda: api.replace("absent", {"id": "absent", "pk": "p"}),
            lambda: api.patch("absent", "p", [{"op": "set", "path": "/n", "value": 1}]),
            lambda: api.delete("absent", "p"),
        ]
        for attempt in attempts:
            with pytest.raises(exceptions.CosmosResourceNotFoundError) as err:
                await attempt()
            assert err.value.status_code == 404

    run(scenario)


def test_duplicate_create_is_409_but_same_id_in_another_partition_is_not(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "a", "pk": "p"})
        with pytest.raises(exceptions.CosmosResourceExistsError) as err:
            await api.create({"id": "a", "pk": "p"})
        assert err.value.status_code == 409
        await api.create({"id": "a", "pk": "q"})

    run(scenario)


def test_replace_with_stale_etag_is_412(run: Any) -> None:
    async def scenario(api: Api) -> None:
        first = await api.create({"id": "a", "pk": "p", "n": 0})
        second = await api.replace(
            "a",
            {"id": "a", "pk": "p", "n": 1},
            etag=first["_etag"],
            match_condition=MatchConditions.IfNotModified,
        )
        assert second["_etag"] != first["_etag"]
        with pytest.raises(exceptions.CosmosAccessConditionFailedError) as err:
            await api.replace(
                "a",
                {"id": "a", "pk": "p", "n": 2},
                etag=first["_etag"],
                match_condition=MatchConditions.IfNotModified,
            )
        assert err.value.status_code == 412
        assert (await api.read("a", "p"))["n"] == 1

    run(scenario)


def test_patch_filter_predicate_false_is_412_true_applies(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "a", "pk": "p", "version": 3, "outboxSeq": 7, "tag": "AbC"})
        ops = [{"op": "incr", "path": "/version", "value": 1}]
        for predicate in (
            "from c where c.version = 2",
            "from c where c.outboxSeq = 8",
            "from c where c.tag = 'abc'",  # string comparison is case-sensitive
        ):
            with pytest.raises(exceptions.CosmosAccessConditionFailedError) as err:
                await api.patch("a", "p", ops, filter_predicate=predicate)
            assert err.value.status_code == 412
        assert (await api.read("a", "p"))["version"] == 3
        predicate = "from c where c.version = 3 AND c.outboxSeq = 7 AND c.tag = 'AbC'"
        patched = await api.patch("a", "p", ops, filter_predicate=predicate)
        assert patched["version"] == 4

    run(scenario)


def test_patch_filter_predicate_sees_only_the_item_in_its_partition(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "a", "pk": "p", "version": 1})
        await api.create({"id": "a", "pk": "q", "version": 2})
        ops = [{"op": "set", "path": "/version", "value": 9}]
        with pytest.raises(exceptions.CosmosAccessConditionFailedError):
            await api.patch("a", "p", ops, filter_predicate="from c where c.version = 2")
        assert (await api.read("a", "p"))["version"] == 1

    run(scenario)


def test_item_over_2_mb_is_413_and_changes_nothing(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "a", "pk": "p", "blob": "x" * 1_900_000})  # under the limit
        too_big = "y" * (2 * 1024 * 1024)
        attempts: list[Callable[[], Awaitable[Any]]] = [
            lambda: api.create({"id": "b", "pk": "p", "blob": too_big}),
            lambda: api.replace("a", {"id": "a", "pk": "p", "blob": too_big}),
            lambda: api.patch("a", "p", [{"op": "set", "path": "/more", "value": "z" * 300_000}]),
        ]
        for attempt in attempts:
            with pytest.raises(exceptions.CosmosHttpResponseError) as err:
                await attempt()
            assert err.value.status_code == 413
        item = await api.read("a", "p")
        assert len(item["blob"]) == 1_900_000 and "more" not in item
        with pytest.raises(exceptions.CosmosResourceNotFoundError):
            await api.read("b", "p")

    run(scenario)


def test_parameterized_query_in_one_partition_and_across_partitions(run: Any) -> None:
    async def scenario(api: Api) -> None:
        for n in range(6):
            await api.create(
                {"id": f"i{n}", "pk": "p" if n % 2 else "q", "n": n, "box": [n] * (n % 3)}
            )
        sql = "SELECT VALUE c.id FROM c WHERE c.n >= @n AND ARRAY_LENGTH(c.box) > 0"
        params = [{"name": "@n", "value": 1}]
        assert sorted(await api.query(sql, params, partition_key="p")) == ["i1", "i5"]
        assert sorted(await api.query(sql, params)) == ["i1", "i2", "i4", "i5"]
        hostile = [{"name": "@n", "value": "1 OR 1=1"}]
        assert await api.query(sql, hostile) == []

    run(scenario)


# --- transactional batch ------------------------------------------------------------------


def test_batch_applies_every_operation_kind(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "r", "pk": "p", "n": 1})
        await api.create({"id": "d", "pk": "p"})
        results = await api.batch(
            [
                ("create", ({"id": "c", "pk": "p"},)),
                ("upsert", ({"id": "u", "pk": "p", "n": 0},)),
                ("replace", ("r", {"id": "r", "pk": "p", "n": 2})),
                (
                    "patch",
                    ("r", [{"op": "incr", "path": "/n", "value": 1}]),
                    {"filter_predicate": "from c where c.n = 2"},
                ),
                ("read", ("r",)),
                ("delete", ("d",)),
            ],
            "p",
        )
        assert [r["statusCode"] for r in results] == [201, 201, 200, 200, 200, 204]
        assert results[4]["resourceBody"]["n"] == 3
        assert (await api.read("r", "p"))["n"] == 3
        await api.read("c", "p")
        with pytest.raises(exceptions.CosmosResourceNotFoundError):
            await api.read("d", "p")

    run(scenario)


@pytest.mark.parametrize(
    ("failing", "status"),
    [
        (("create", ({"id": "existing", "pk": "p"},)), 409),
        (("replace", ("absent", {"id": "absent", "pk": "p"})), 404),
        (
            (
                "patch",
                ("existing", [{"op": "incr", "path": "/n", "value": 1}]),
                {"filter_predicate": "from c where c.n = 99"},
            ),
            412,
        ),
    ],
    ids=["409-create", "404-replace", "412-patch"],
)
def test_failed_batch_is_207_and_applies_nothing(run: Any, failing: Any, status: int) -> None:
    async def scenario(api: Api) -> None:
        existing = await api.create({"id": "existing", "pk": "p", "n": 0})
        _, before = await api.feed_page(start_time="Now")
        with pytest.raises(exceptions.CosmosBatchOperationError) as err:
            await api.batch(
                [
                    ("create", ({"id": "new", "pk": "p"},)),
                    ("patch", ("existing", [{"op": "incr", "path": "/n", "value": 1}])),
                    copy.deepcopy(failing),  # the SDK pops the options of an operation
                    ("upsert", ({"id": "later", "pk": "p"},)),
                ],
                "p",
            )
        assert err.value.status_code == status
        assert err.value.error_index == 2
        statuses = [r["statusCode"] for r in err.value.operation_responses]
        assert statuses == [424, 424, status, 424]
        # Atomic: nothing applied, not even the operations before the failing one.
        assert await api.read("existing", "p") == existing
        for absent in ("new", "later"):
            with pytest.raises(exceptions.CosmosResourceNotFoundError):
                await api.read(absent, "p")
        items, _ = await api.feed_page(continuation=before)
        assert items == []

    run(scenario)


# --- change feed ------------------------------------------------------------------------


def test_change_feed_never_splits_a_batch_across_pages(run: Any) -> None:
    """The writes of one transactional batch are one transaction in the change feed: they
    share an LSN and come in one page, even beyond max_item_count (Cosmos documents that a
    page may then hold more items than asked for)."""

    async def scenario(api: Api) -> None:
        _, token = await api.feed_page(start_time="Now", partition_key="p")
        await api.create({"id": "before", "pk": "p"})
        await api.batch([("create", ({"id": f"b{n}", "pk": "p"},)) for n in range(3)], "p")
        await api.create({"id": "after", "pk": "p"})
        pages: list[list[dict[str, Any]]] = []
        for _ in range(4):
            items, token = await api.feed_page(
                continuation=token, partition_key="p", max_item_count=2
            )
            if not items:
                break
            pages.append(items)
        ids = [[d["id"] for d in page] for page in pages]
        assert [i for page in ids for i in page] == ["before", "b0", "b1", "b2", "after"]
        (batch_page,) = [page for page in pages if any(d["id"] == "b0" for d in page)]
        batch_lsns = {
            d["_lsn"] for d in batch_page if d["id"].startswith("b") and d["id"] != "before"
        }
        assert len(batch_lsns) == 1
        assert {"b0", "b1", "b2"} <= {d["id"] for d in batch_page}

    run(scenario)


def test_change_feed_from_now_is_304_until_a_write(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "old", "pk": "p"})
        items, token = await api.feed_page(start_time="Now")
        assert items == []
        assert api.statuses and set(api.statuses) == {304}
        api.statuses.clear()
        items, token_again = await api.feed_page(continuation=token)
        assert items == [] and set(api.statuses) == {304}
        for i in range(3):
            await api.create({"id": f"n{i}", "pk": "p"})
        items, after = await api.feed_page(continuation=token_again)
        assert [d["id"] for d in items] == ["n0", "n1", "n2"]
        api.statuses.clear()
        items, _ = await api.feed_page(continuation=after)
        assert items == [] and set(api.statuses) == {304}

    run(scenario)


def test_change_feed_is_latest_version_in_lsn_order_without_deletes(run: Any) -> None:
    async def scenario(api: Api) -> None:
        _, token = await api.feed_page(start_time="Now")
        await api.create({"id": "a", "pk": "p", "n": 1})
        await api.create({"id": "b", "pk": "p", "n": 1})
        await api.create({"id": "gone", "pk": "p"})
        await api.upsert({"id": "a", "pk": "p", "n": 2})
        await api.patch("a", "p", [{"op": "set", "path": "/n", "value": 3}])
        await api.delete("gone", "p")
        items, token = await api.feed_page(continuation=token, partition_key="p")
        assert [(d["id"], d["n"]) for d in items] == [("b", 1), ("a", 3)]
        lsns = [d["_lsn"] for d in items]
        assert lsns == sorted(lsns) and len(set(lsns)) == 2
        await api.replace("b", {"id": "b", "pk": "p", "n": 2})
        items, _ = await api.feed_page(continuation=token, partition_key="p")
        assert [(d["id"], d["n"]) for d in items] == [("b", 2)]
        assert items[0]["_lsn"] > lsns[-1]
        # Point reads carry no _lsn; only the change feed does.
        assert "_lsn" not in await api.read("b", "p")

    run(scenario)


def test_change_feed_from_a_point_in_time(run: Any) -> None:
    async def scenario(api: Api) -> None:
        await api.create({"id": "before", "pk": "p"})
        await asyncio.sleep(1.2)  # the start time has whole seconds
        start = datetime.now(UTC)
        await asyncio.sleep(1.2)
        await api.create({"id": "after", "pk": "p"})
        await api.upsert({"id": "before", "pk": "p", "touched": True})
        items = await api.feed_all(start_time=start, partition_key="p")
        assert [d["id"] for d in items] == ["after", "before"]

    run(scenario)


def test_change_feed_pages_by_max_item_count_and_resumes(run: Any) -> None:
    async def scenario(api: Api) -> None:
        ids = [f"i{n:02}" for n in range(25)]
        for n, item in enumerate(ids):
            await api.create({"id": item, "pk": f"k{n % 5}"})
        seen: list[str] = []
        tokens: list[str] = []
        for feed_range in await api.feed_ranges():
            items, token = await api.feed_page(
                feed_range=feed_range, start_time="Beginning", max_item_count=4
            )
            while items:
                assert 0 < len(items) <= 4
                seen += [d["id"] for d in items]
                items, token = await api.feed_page(continuation=token, max_item_count=4)
            tokens.append(token)
        assert sorted(seen) == ids  # every item exactly once
        await api.create({"id": "late", "pk": "k0"})
        late: list[str] = []
        for token in tokens:
            items, _ = await api.feed_page(continuation=token, max_item_count=4)
            late += [d["id"] for d in items]
        assert late == ["late"]

    run(scenario)


def test_whole_container_continuation_needs_every_range_to_have_answered(run: Any) -> None:
    """An SDK limitation the dispatcher must avoid: with several feed ranges, the
    continuation of a whole-container feed read before every range has answered holds
    ``token: None`` entries, and the SDK refuses to parse its own token."""

    async def scenario(api: Api) -> None:
        if len(await api.feed_ranges()) < 2:
            pytest.skip("the container has a single feed range")
        for n in range(20):
            await api.create({"id": f"i{n}", "pk": f"k{n}"})
        items, token = await api.feed_page(start_time="Beginning", max_item_count=2)
        assert len(items) == 2
        with pytest.raises(ValueError, match="Missing token"):
            await api.feed_page(continuation=token)

    run(scenario)


def test_feed_ranges_split_items_by_effective_partition_key(run: Any) -> None:
    async def scenario(api: Api) -> None:
        ranges = await api.feed_ranges()
        if api.emulated:
            assert len(ranges) >= 2  # 4 unless COSMOSDB_SERVER_FEED_RANGES says otherwise
        keys = [f"key-{n}" for n in range(40)] + [7, 3.5, True, ""]
        for n, key in enumerate(keys):
            await api.create({"id": f"i{n}", "pk": key})
        owner: dict[str, int] = {}
        for n, key in enumerate(keys):
            pk_range = await api.feed_range_for(key)
            owners = [i for i, r in enumerate(ranges) if await api.is_subset(r, pk_range)]
            assert len(owners) == 1, (key, owners)
            owner[f"i{n}"] = owners[0]
        if api.emulated:
            assert len(set(owner.values())) == len(ranges)  # every range owns some keys
        for i, feed_range in enumerate(ranges):
            items = await api.feed_all(feed_range=feed_range, start_time="Beginning")
            got = sorted(d["id"] for d in items)
            assert got == sorted(k for k, v in owner.items() if v == i)
            lsns = [d["_lsn"] for d in items]
            assert lsns == sorted(lsns)
        # A partition key's own feed range sees exactly its items.
        items = await api.feed_all(
            feed_range=await api.feed_range_for("key-3"), start_time="Beginning"
        )
        assert [d["id"] for d in items] == ["i3"]

    run(scenario)


def test_feed_range_continuations_resume_per_range(run: Any) -> None:
    async def scenario(api: Api) -> None:
        ranges = await api.feed_ranges()
        for n in range(12):
            await api.create({"id": f"old{n}", "pk": f"k{n}"})
        tokens = []
        for feed_range in ranges:
            token = None
            while True:
                kw: dict[str, Any] = (
                    {"continuation": token}
                    if token
                    else {"feed_range": feed_range, "start_time": "Beginning"}
                )
                items, token = await api.feed_page(max_item_count=2, **kw)
                if not items:
                    break
            tokens.append(token)
        for n in range(12):
            await api.upsert({"id": f"new{n}", "pk": f"k{n}"})
        await api.upsert({"id": "old0", "pk": "k0", "touched": True})
        got: list[str] = []
        for feed_range, token in zip(ranges, tokens, strict=True):
            items, _ = await api.feed_page(continuation=token)
            for item in items:
                item_range = await api.feed_range_for(item["pk"])
                assert await api.is_subset(feed_range, item_range)
            got += [d["id"] for d in items]
        assert sorted(got) == sorted([f"new{n}" for n in range(12)] + ["old0"])

    run(scenario)


def test_change_feed_for_one_partition_key(run: Any) -> None:
    async def scenario(api: Api) -> None:
        for n in range(10):
            await api.create({"id": f"i{n}", "pk": f"k{n % 3}"})
        items = await api.feed_all(partition_key="k1", start_time="Beginning")
        assert [d["id"] for d in items] == ["i1", "i4", "i7"]

    run(scenario)
