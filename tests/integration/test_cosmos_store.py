"""The Cosmos DB store's Cosmos-specific guarantees, on the session's Cosmos account (the
local server, or COSMOS_ENDPOINT/COSMOS_KEY). The store under contention is tested on
every backend in ``test_concurrency.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, AsyncAggregateStore, RetryPolicy, StoreConfig
from docoutbox.errors import DocumentTooLarge, InvalidAggregateId
from docoutbox.store.plans import plan_trim
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import AsyncCosmosBackend, CosmosBackend, Throttled
from tests.support.backends import PATIENT
from tests.support.cosmos import create_container

pytestmark = pytest.mark.cosmos


@pytest.fixture
def container(cosmos_database: Any) -> Any:
    return create_container(cosmos_database)


def test_a_trim_aimed_by_an_older_copy_keeps_a_concurrent_append(container: Any) -> None:
    """The dispatcher trims at the positions of its copy of the item (one patch, no read):
    an entry appended since is neither lost nor removed, ``version`` does not move, and a
    copy whose positions moved costs a read, never a wrong removal."""
    requests: list[str] = []
    store = AggregateStore(CosmosBackend(container), Counter)
    store.handle("a", add_msg("m1", emits=3), counter_handlers, create=True)
    copy = [e.id for e in store.get("a").outbox]  # the dispatcher's copy
    assert store.handle("a", add_msg("m2"), counter_handlers).applied  # appended since
    trimmer = CosmosBackend(container, on_charge=lambda kind, *_: requests.append(kind))
    assert trimmer.write(plan_trim("a", copy[:2], copy))
    assert requests == ["patch"]
    after = store.get("a")
    assert [e.seq for e in after.outbox] == [3, 4] and after.version == 2
    assert store.handle("a", add_msg("m3"), counter_handlers).attempts == 1
    requests.clear()
    assert trimmer.write(plan_trim("a", [copy[2]], copy))  # copy[2] moved from 2 to 0
    assert "read" in requests
    after = store.get("a")
    assert [e.seq for e in after.outbox] == [4, 5] and after.version == 3


def test_commits_over_ten_patch_operations_keep_untrimmed_entries(container: Any) -> None:
    """Twelve emits need more than one patch: the ETag-guarded replace takes them, and
    partial trims in between keep exactly the entries they did not name."""
    store = AggregateStore(CosmosBackend(container), Counter, PATIENT)
    store.create("big", Counter())
    published: dict[str, int] = {}
    for i in range(15):
        outcome = store.handle("big", add_msg(f"m{i}", emits=12), counter_handlers)
        assert outcome.applied and outcome.attempts == 1
        snapshot = store.get("big")
        batch = [(e.id, e.seq) for e in snapshot.outbox][:7]
        published.update(batch)
        assert store.trim("big", [entry_id for entry_id, _ in batch])
    final = store.get("big")
    assert final.outbox_seq == 180 and final.version == 15
    assert sorted([*published.values(), *(e.seq for e in final.outbox)]) == list(range(1, 181))


def test_ids_cosmos_cannot_store_are_encoded_and_partition_keys_checked(container: Any) -> None:
    store = AggregateStore(CosmosBackend(container), Counter)
    for aggregate_id in ["a/b", "c\\d", "e?f", "g#h", "~n1", 1]:
        store.handle(aggregate_id, add_msg("m"), counter_handlers, create=True)
        assert store.get(aggregate_id).aggregate_id == aggregate_id
    assert {s.aggregate_id for s in store.pending()} == {"a/b", "c\\d", "e?f", "g#h", "~n1", 1}
    with pytest.raises(InvalidAggregateId):
        store.handle("/" * 130, add_msg("m"), counter_handlers, create=True)


def test_a_dedicated_partition_key_field(cosmos_database: Any) -> None:
    container = create_container(cosmos_database, path="/tenant")
    backend = CosmosBackend(
        container, partition_key_path="/tenant", partition_key=lambda a: str(a)[:1]
    )
    store = AggregateStore(backend, Counter)
    for aggregate_id in ["a1", "a2", "b1"]:
        store.handle(aggregate_id, add_msg("m", emits=2), counter_handlers, create=True)
    item = container.read_item("a2", partition_key="a")
    assert item["tenant"] == "a" and item["aid"] == "a2"
    assert store.trim("a2", [e.id for e in store.get("a2").outbox])
    assert [s.aggregate_id for s in store.pending()] == ["a1", "b1"]


def test_the_size_guard_is_cosmos_two_megabytes(container: Any) -> None:
    store = AggregateStore(CosmosBackend(container), Counter)
    store.create("c1", Counter())
    big = add_msg("big")
    big = big.model_copy(update={"payload": {"n": 1, "blob": "x" * (2 * 1024 * 1024)}})
    with pytest.raises(DocumentTooLarge) as caught:
        store.handle("c1", big, counter_handlers)
    assert caught.value.limit == 2 * 1024 * 1024
    assert store.get("c1").version == 0


# -- faults injected into the local server --------------------------------------------


def _faulty(cosmos_server: CosmosAccount) -> CosmosAccount:
    if not cosmos_server.emulated:
        pytest.skip("fault injection needs the local Cosmos DB server")
    return cosmos_server


def _impatient_container(account: CosmosAccount, database: Any, container: Any) -> Any:
    """The container through a client whose SDK retries a 429 only once."""
    kwargs = {**account.client_kwargs, "retry_throttle_total": 1}
    client = CosmosAccount(account.endpoint, account.key, kwargs, emulated=True).client()
    return client.get_database_client(database.id).get_container_client(container.id)


def test_throttled_requests_are_resent_after_the_servers_delay(
    cosmos_server: CosmosAccount, cosmos_database: Any, container: Any
) -> None:
    account = _faulty(cosmos_server)
    charges: list[tuple[str, int, float]] = []
    backend = CosmosBackend(
        _impatient_container(account, cosmos_database, container),
        on_charge=lambda *c: charges.append(c),
    )
    store = AggregateStore(backend, Counter)
    store.create("c1", Counter())
    where = f"/dbs/{cosmos_database.id}/"
    account.inject_fault(status=429, retryAfterMs=20, count=4, method="PATCH", pathContains=where)
    outcome = store.handle("c1", add_msg("m1"), counter_handlers)
    assert outcome.applied and outcome.attempts == 1  # resent by the backend, not the core
    assert [status for kind, status, _ in charges if kind == "patch"].count(429) == 4
    account.inject_fault(status=429, retryAfterMs=1, count=40, method="PATCH", pathContains=where)
    try:
        with pytest.raises(Throttled):
            backend.write(plan_trim("c1", [store.get("c1").outbox[0].id]))
    finally:
        account.clear_faults()
    assert len(store.get("c1").outbox) == 1  # nothing was trimmed


def test_unavailable_and_lost_replies_never_apply_a_message_twice(
    cosmos_server: CosmosAccount, cosmos_database: Any, container: Any
) -> None:
    account = _faulty(cosmos_server)
    store = AggregateStore(CosmosBackend(container), Counter, PATIENT)
    store.create("c1", Counter())
    where = f"/dbs/{cosmos_database.id}/"
    account.inject_fault(status=503, count=1, method="PATCH", pathContains=where)
    first = store.handle("c1", add_msg("m1"), counter_handlers)
    assert first.applied and first.attempts == 2  # TransientStoreError, retried by the core
    account.inject_fault(dropReply=True, count=1, method="PATCH", pathContains=where)
    lost = store.handle("c1", add_msg("m2"), counter_handlers)
    # The commit applied but its reply was lost: the retry finds m2 in the inbox.
    assert lost.duplicate or lost.applied
    snap = store.get("c1")
    assert (snap.version, snap.state.total, snap.state.applied) == (2, 2, ["m1", "m2"])
    assert [e.seq for e in snap.outbox] == [1, 2]


def test_a_lost_reply_to_an_aio_commit_is_not_applied_twice(
    cosmos_server: CosmosAccount, cosmos_database: Any, container: Any
) -> None:
    """azure.cosmos.aio resends a write whose reply was lost and then gets 412 for its own
    commit: the store reloads, finds the message in the inbox, and applies nothing twice."""
    account = _faulty(cosmos_server)

    async def scenario() -> None:
        async with account.async_client() as client:
            proxy = client.get_database_client(cosmos_database.id).get_container_client(
                container.id
            )
            store = AsyncAggregateStore(AsyncCosmosBackend(proxy), Counter, PATIENT)
            await store.create("c1", Counter())
            where = f"/dbs/{cosmos_database.id}/"
            account.inject_fault(dropReply=True, count=1, method="PATCH", pathContains=where)
            await store.handle("c1", add_msg("m1"), counter_handlers)
            snap = await store.get("c1")
            assert (snap.version, snap.state.total, len(snap.outbox)) == (1, 1, 1)

    asyncio.run(scenario())


@pytest.mark.parametrize("driver", ["sync", "aio"])
def test_a_lost_reply_on_the_last_attempt_is_read_back_the_same_on_sync_and_aio(
    cosmos_server: CosmosAccount, cosmos_database: Any, container: Any, driver: str
) -> None:
    """The commit applies and its reply is lost. The sync SDK raises (ServiceResponseError),
    azure.cosmos.aio resends and gets 412 for its own write. With no attempt left, both
    stores read the document and answer APPLIED: the message is in the stored inbox (they
    answered TransientStoreError and GAVE_UP, "nothing was written")."""

    account = _faulty(cosmos_server)
    last = StoreConfig(retry=RetryPolicy(max_attempts=1))
    where = f"/dbs/{cosmos_database.id}/"

    async def aio() -> Any:
        async with account.async_client() as client:
            proxy = client.get_database_client(cosmos_database.id).get_container_client(
                container.id
            )
            store = AsyncAggregateStore(AsyncCosmosBackend(proxy), Counter, last)
            await store.create("c1", Counter())
            account.inject_fault(dropReply=True, count=1, method="PATCH", pathContains=where)
            return await store.handle("c1", add_msg("m1", emits=1), counter_handlers)

    if driver == "aio":
        outcome = asyncio.run(aio())
    else:
        store = AggregateStore(CosmosBackend(container), Counter, last)
        store.create("c1", Counter())
        account.inject_fault(dropReply=True, count=1, method="PATCH", pathContains=where)
        outcome = store.handle("c1", add_msg("m1", emits=1), counter_handlers)
    assert outcome.status.value == "applied"
    snap = AggregateStore(CosmosBackend(container), Counter).get("c1")
    assert (snap.version, snap.state.applied) == (1, ["m1"])
    assert [e.id for e in snap.outbox] == [e.id for e in outcome.emitted]
