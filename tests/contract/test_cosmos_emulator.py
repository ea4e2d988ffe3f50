"""The local Cosmos DB server itself: the patch's partition-key hashing against the SDK's,
its configurable feed ranges, its launcher's lifetime, and container replacement.

All but the last need node and ``scripts/servers.sh install-cosmos``; the last runs on
``cosmos_server`` (a real account too when ``COSMOS_ENDPOINT``/``COSMOS_KEY`` are set).
"""

from __future__ import annotations

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
from typing import Any

import pytest
from azure.cosmos import PartitionKey

from tests.conftest import missing
from tests.support.servers import (
    COSMOS_DIR,
    REPO_ROOT,
    CosmosAccount,
    CosmosServer,
    cosmos_server_available,
)

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
        "from tests.support.servers import CosmosServer\n"
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
