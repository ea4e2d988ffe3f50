"""The local Cosmos DB server itself: the patch's partition-key hashing against the SDK's,
its configurable feed ranges, its launcher's lifetime, container replacement, and the
faults and partition splits it can inject (throttling, errors, lost requests and replies).

All but the last need node and ``scripts/servers.sh install-cosmos``; the last runs on
``cosmos_server`` (a real account too when ``COSMOS_ENDPOINT``/``COSMOS_KEY`` are set).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import random
import shutil
import socket
import string
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.cosmos import PartitionKey, exceptions

from benchmarks.servers import COSMOS_DIR, CosmosAccount, CosmosServer, cosmos_server_available
from tests.conftest import missing
from tests.support.servers import REPO_ROOT

pytestmark = pytest.mark.cosmos

FEED_JS = COSMOS_DIR / "feed" / "index.js"


@pytest.fixture
def node() -> str:
    reason = cosmos_server_available()
    if reason:
        missing(f"Cosmos DB server unavailable ({reason})")
    path = shutil.which("node")
    assert path is not None
    return path


def _sample_values() -> list[Any]:
    rng = random.Random(7)
    values: list[Any] = ["", "a", "hello world", "ünïcødé ✓ 漢字", "x" * 15, "y" * 16, "z" * 17]
    values += ["w" * 300, 0, 1, -1, 2**31, 2**53, 3.5, -0.25, 1e20, True, False, None]
    values += [
        "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40))) for _ in range(300)
    ]
    values += [rng.randint(-(10**12), 10**12) for _ in range(100)]
    values += [rng.uniform(-1e6, 1e6) for _ in range(50)]
    return values


def test_effective_partition_keys_match_the_sdk(node: str) -> None:
    """The patch's JS port of MurmurHash3 and the EPK encoding (hash v2 and MultiHash)
    gives the SDK's own effective partition key for every sampled value."""
    values = _sample_values()
    pairs = [[values[i], values[-i - 1]] for i in range(80)]
    hashed = PartitionKey(path="/pk", kind="Hash", version=2)
    multi = PartitionKey(path=["/a", "/b"], kind="MultiHash", version=2)
    expected = [hashed._get_epk_range_for_partition_key(v).min for v in values]
    expected_multi = [multi._get_epk_range_for_partition_key(p).min for p in pairs]
    script = """
const feed = require(process.argv[1]);
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const hash = { paths: ["/pk"], kind: "Hash", version: 2 };
const multi = { paths: ["/a", "/b"], kind: "MultiHash", version: 2 };
console.log(JSON.stringify([
    input.values.map(v => feed.effectivePartitionKey(hash, [v])),
    input.pairs.map(p => feed.effectivePartitionKey(multi, p)),
]));
"""
    out = subprocess.run(
        [node, "-e", script, str(FEED_JS)],
        input=json.dumps({"values": values, "pairs": pairs}),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    got, got_multi = json.loads(out)
    assert [(v, g) for v, g in zip(values, got, strict=True)] == list(
        zip(values, expected, strict=True)
    )
    assert got_multi == expected_multi


def test_feed_range_count_is_configurable_and_ranges_tile_the_key_space(node: str) -> None:
    with CosmosServer(feed_ranges=3) as server, server.account().client() as client:
        database = client.create_database("feed_ranges")
        container = database.create_container("c", PartitionKey(path="/pk"))
        ranges = [r["Range"] for r in container.read_feed_ranges()]
        assert len(ranges) == 3
        assert ranges[0]["min"] == "" and ranges[-1]["max"] == "FF"
        for left, right in itertools.pairwise(ranges):
            assert left["max"] == right["min"]
        # A container without a hash v2 partition key keeps the stock single range.
        legacy = database.create_container(
            "legacy", PartitionKey(path="/pk", kind="Hash", version=1)
        )
        assert len(list(legacy.read_feed_ranges())) == 1


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_server_dies_with_the_process_that_started_it(node: str) -> None:
    """A kill -9 of the test process leaves no server behind (it exits on stdin EOF)."""
    code = (
        "import time\n"
        "from benchmarks.servers import CosmosServer\n"
        "server = CosmosServer().start()\n"
        "print(server.port, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        port = int(parent.stdout.readline())
        assert _port_open(port)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _port_open(port)


def test_replacing_a_container_keeps_its_items(cosmos_server: CosmosAccount) -> None:
    with cosmos_server.client() as client:
        name = f"docoutbox_replace_{uuid.uuid4().hex[:12]}"
        database = client.create_database(name)
        try:
            container = database.create_container("c", PartitionKey(path="/pk"))
            container.create_item({"id": "a", "pk": "p"})
            ranges = list(container.read_feed_ranges())
            database.replace_container(
                container,
                partition_key=PartitionKey(path="/pk"),
                indexing_policy={"indexingMode": "consistent", "excludedPaths": [{"path": "/x/*"}]},
            )
            assert container.read_item("a", partition_key="p")["id"] == "a"
            assert list(container.read_feed_ranges(force_refresh=True)) == ranges
            changes = list(container.query_items_change_feed(start_time="Beginning"))
            assert [d["id"] for d in changes] == ["a"]
        finally:
            client.delete_database(name)


# --- injected faults -------------------------------------------------------------------


@pytest.fixture
def scratch(cosmos_server: CosmosAccount) -> Iterator[tuple[CosmosAccount, str]]:
    """The local server and a scratch database name; faults are filtered on that name, so
    other tests sharing the server never meet them."""
    if not cosmos_server.emulated:
        pytest.skip("fault injection needs the local Cosmos DB server")
    name = f"docoutbox_faults_{uuid.uuid4().hex[:12]}"
    with cosmos_server.client() as client:
        client.create_database(name).create_container("c", PartitionKey(path="/pk"))
        try:
            yield cosmos_server, name
        finally:
            cosmos_server.clear_faults()
            client.delete_database(name)


def _container(account: CosmosAccount, database: str, **client_kwargs: Any) -> Any:
    kwargs = {**account.client_kwargs, **client_kwargs}
    client = CosmosAccount(account.endpoint, account.key, kwargs, emulated=True).client()
    return client.get_database_client(database).get_container_client("c")


def test_injected_throttling_is_retried_by_the_sdk_then_surfaces(
    scratch: tuple[CosmosAccount, str],
) -> None:
    account, name = scratch
    container = _container(account, name)
    account.inject_fault(status=429, retryAfterMs=5, count=2, pathContains=f"/dbs/{name}/")
    container.create_item({"id": "a", "pk": "p"})  # two 429s, retried after 5 ms each
    impatient = _container(account, name, retry_throttle_total=1)
    account.inject_fault(status=429, retryAfterMs=5, count=5, pathContains=f"/dbs/{name}/")
    with pytest.raises(exceptions.CosmosHttpResponseError) as err:
        impatient.read_item("a", partition_key="p")
    assert err.value.status_code == 429
    account.clear_faults()
    assert container.read_item("a", partition_key="p")["id"] == "a"


def test_lost_reply_sync_sdk_raises_aio_sdk_sends_the_write_again(
    scratch: tuple[CosmosAccount, str],
) -> None:
    """What a client sees when a write applies but its reply is lost (true on Cosmos too:
    this is the SDKs' retry behaviour). The sync SDK raises ServiceResponseError. The aio
    SDK sends the write again: an unconditional patch applies twice, a create gets 409 for
    its own first attempt, and a conditional patch gets 412 although it applied. A store
    must therefore make every write conditional and, on 409/412 after a connection error,
    read back to learn whether its write applied."""
    account, name = scratch
    container = _container(account, name)
    lost_reply = {"dropReply": True, "pathContains": f"/dbs/{name}/"}
    account.inject_fault(method="POST", **lost_reply)
    with pytest.raises(ServiceResponseError):
        container.create_item({"id": "a", "pk": "p", "n": 0})
    assert container.read_item("a", partition_key="p")["n"] == 0  # applied all the same
    incr = [{"op": "incr", "path": "/n", "value": 1}]
    account.inject_fault(dropRequest=True, method="PATCH", pathContains=f"/dbs/{name}/")
    with pytest.raises(ServiceResponseError):
        container.patch_item("a", partition_key="p", patch_operations=incr)
    assert container.read_item("a", partition_key="p")["n"] == 0  # not applied

    async def aio_lost_replies() -> None:
        async with account.async_client() as client:
            aio = client.get_database_client(name).get_container_client("c")
            account.inject_fault(method="PATCH", **lost_reply)
            patched = await aio.patch_item("a", partition_key="p", patch_operations=incr)
            assert patched["n"] == 2  # one call, applied twice
            account.inject_fault(method="POST", **lost_reply)
            with pytest.raises(exceptions.CosmosResourceExistsError):
                await aio.create_item({"id": "b", "pk": "p"})
            account.inject_fault(method="PATCH", **lost_reply)
            with pytest.raises(exceptions.CosmosAccessConditionFailedError):
                await aio.patch_item(
                    "a",
                    partition_key="p",
                    patch_operations=incr,
                    filter_predicate="from c where c.n = 2",
                )

    asyncio.run(aio_lost_replies())
    assert container.read_item("a", partition_key="p")["n"] == 3
    assert container.read_item("b", partition_key="p")["id"] == "b"


def test_injected_status_filtered_by_header_hits_only_the_change_feed(
    scratch: tuple[CosmosAccount, str],
) -> None:
    account, name = scratch
    container = _container(account, name, retry_throttle_total=1)
    container.create_item({"id": "a", "pk": "p"})
    account.inject_fault(
        status=503, count=10, pathContains=f"/dbs/{name}/", headers={"A-IM": "Incremental Feed"}
    )
    assert container.read_item("a", partition_key="p")["id"] == "a"
    with pytest.raises(exceptions.CosmosHttpResponseError) as err:
        list(container.query_items_change_feed(start_time="Beginning"))
    assert err.value.status_code == 503


# --- partition splits ------------------------------------------------------------------


def _drain(container: Any, **kw: Any) -> tuple[list[dict[str, Any]], str]:
    pages = container.query_items_change_feed(**kw).by_page()
    items = [item for page in pages for item in page]
    token = pages.continuation_token or container.client_connection.last_response_headers["etag"]
    return items, token


def _token_ranges(token: str) -> list[tuple[str, str]]:
    state = json.loads(base64.b64decode(token))
    return [(t["range"]["min"], t["range"]["max"]) for t in state["continuation"]["continuation"]]


def test_continuations_survive_a_feed_range_split(scratch: tuple[CosmosAccount, str]) -> None:
    """A split replaces a range by two children: a continuation of the parent range gets
    410/1002 from the server, and the SDK (sync and aio) resumes it on both children,
    losing and repeating nothing."""
    account, name = scratch
    container = _container(account, name)
    for n in range(40):
        container.create_item({"id": f"old{n}", "pk": f"k{n}"})
    ranges = list(container.read_feed_ranges())
    tokens = [_drain(container, feed_range=r, start_time="Beginning")[1] for r in ranges]
    children = account.split_feed_range(name, "c", "1")
    assert children == ["4", "5"]
    assert len(list(container.read_feed_ranges(force_refresh=True))) == len(ranges) + 1
    for n in range(40):
        container.create_item({"id": f"new{n}", "pk": f"k{n}"})
    seen: list[str] = []
    for feed_range, token in zip(ranges, tokens, strict=True):
        items, after = _drain(container, continuation=token)
        for item in items:
            item_range = container.feed_range_from_partition_key(item["pk"])
            assert container.is_feed_range_subset(feed_range, item_range)
        seen += [d["id"] for d in items]
        if feed_range is ranges[1]:  # the range that split: resumed on both children
            split_items = sorted(d["id"] for d in items)
            assert len(_token_ranges(after)) == 2

    async def resume_split_range_with_aio() -> list[str]:
        async with account.async_client() as client:
            aio = client.get_database_client(name).get_container_client("c")
            pages = aio.query_items_change_feed(continuation=tokens[1]).by_page()
            ids = [item["id"] async for page in pages async for item in page]
            assert len(_token_ranges(pages.continuation_token)) == 2
            return sorted(ids)

    assert sorted(seen) == sorted(f"new{n}" for n in range(40))
    assert split_items and asyncio.run(resume_split_range_with_aio()) == split_items
