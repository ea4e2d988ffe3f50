"""``docoutbox dispatch`` against a Cosmos DB endpoint with a self-signed certificate.

The local server serves HTTPS with a throwaway certificate made here (as the official
emulator serves its own): ``--cosmos-ca-file`` (or ``COSMOS_CA_FILE``) trusts it, without
it the certificate is refused, ``--cosmos-insecure`` skips the check and says so loudly.
The account key is masked in every line, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError

from benchmarks.servers import CosmosAccount, CosmosServer, cosmos_server_available
from docoutbox import AggregateStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_cosmos import CosmosBackend
from docoutbox_spark.cosmos_source import CosmosReader
from docoutbox_spark.schema import RAW_DOCUMENT_SCHEMA
from tests.conftest import missing
from tests.support.cosmos import create_container, scratch_database
from tests.support.processes import CliProcess

pytestmark = pytest.mark.cosmos

#: Not 127.0.0.1: azure-cosmos checks no certificate of a 127.0.0.1 or localhost endpoint
#: unless given a CA (its emulator convention), so a refusal could not show there.
HOST = "127.0.0.2"
#: Any base64 key: the local server does not check signatures. Never in any output.
KEY = "dGxzLXRlc3Qta2V5LXRoYXQtbXVzdC1uZXZlci1zaG93LXVw"


def self_signed(directory: Path, name: str) -> tuple[str, str]:
    """A throwaway certificate for :data:`HOST` and its key (PEM files in ``directory``)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        missing("openssl is needed to make a test certificate")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            str(openssl), "req", "-x509", "-newkey", "rsa:2048", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", f"/CN={HOST}", "-addext", f"subjectAltName=IP:{HOST}",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CosmosServer]:
    reason = cosmos_server_available()
    if reason:
        missing(f"Cosmos DB server unavailable ({reason}); run scripts/servers.sh install-cosmos")
    directory = tmp_path_factory.mktemp("tls")
    with CosmosServer(tls=self_signed(directory, "server"), feed_ranges=2, host=HOST) as server:
        yield server


@pytest.fixture
def account(tls_server: CosmosServer) -> CosmosAccount:
    return tls_server.account()


@pytest.fixture
def database(account: CosmosAccount) -> Iterator[Any]:
    with scratch_database(account) as db:
        yield db


def cli(*args: str, env: dict[str, str] | None = None) -> CliProcess:
    environment = {**os.environ, "COSMOS_KEY": KEY, **(env or {})}
    for name in ("COSMOS_ENDPOINT", "COSMOS_CA_FILE"):
        if name not in (env or {}):
            environment.pop(name, None)
    return CliProcess(["dispatch", *args], environment, pipes=True)


def _commit(container: Any, count: int) -> None:
    store = AggregateStore(CosmosBackend(container), Counter)
    for i in range(count):
        store.handle(f"a{i % 3}", add_msg(f"m{i}", emits=1), counter_handlers, create=True)


def _dispatch_all(proc: CliProcess, count: int) -> tuple[list[dict[str, Any]], str]:
    lines = proc.lines()
    try:
        published = [json.loads(lines.get(timeout=60)) for _ in range(count)]
        _, err = proc.terminate(timeout=30)
    finally:
        proc.close()
    return published, err


@pytest.mark.parametrize(
    ("how", "flags"),
    [("option", ()), ("env", ()), ("option", ("--async",))],
    ids=["ca-file", "env", "ca-file-async"],
)
def test_a_trusted_ca_file_lets_dispatch_publish(
    tls_server: CosmosServer, database: Any, how: str, flags: tuple[str, ...]
) -> None:
    assert tls_server.tls is not None
    ca_file = tls_server.tls[0]
    assert tls_server.endpoint.startswith("https://")
    _commit(create_container(database, "aggs"), 6)
    option = ("--cosmos-ca-file", ca_file) if how == "option" else ()
    proc = cli(
        *("--cosmos-endpoint", tls_server.endpoint, "--database", database.id),
        *("--container", "aggs", "--publisher", "stdout", "--no-leases", "--log-level", "DEBUG"),
        *option,
        *flags,
        env={"COSMOS_CA_FILE": ca_file} if how == "env" else None,
    )
    published, err = _dispatch_all(proc, 6)
    assert proc.returncode == 0, err
    assert sorted((e["aggregate_id"], e["seq"]) for e in published) == sorted(
        [(f"a{i}", s) for i in range(3) for s in (1, 2)]
    )
    assert KEY not in err


def test_an_untrusted_certificate_is_refused_with_the_key_masked(
    tls_server: CosmosServer, database: Any, tmp_path: Path
) -> None:
    create_container(database, "aggs")
    base = (
        *("--cosmos-endpoint", tls_server.endpoint, "--database", database.id),
        *("--container", "aggs", "--publisher", "stdout", "--server-timeout", "2"),
        *("--log-level", "DEBUG"),
    )
    other_ca, _ = self_signed(tmp_path, "other")  # a CA that did not sign the server's
    for extra in [(), ("--cosmos-ca-file", other_ca)]:
        proc = cli(*base, *extra)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err
        assert err.strip().splitlines()[-1].startswith("docoutbox: error: cannot use Cosmos DB")
        assert "CERTIFICATE_VERIFY_FAILED" in err, err
        assert KEY not in err and KEY not in out


def test_insecure_skips_the_check_and_says_so(tls_server: CosmosServer, database: Any) -> None:
    _commit(create_container(database, "aggs"), 3)
    proc = cli(
        *("--cosmos-endpoint", tls_server.endpoint, "--database", database.id),
        *("--container", "aggs", "--publisher", "stdout", "--no-leases", "--cosmos-insecure"),
    )
    started = time.monotonic()
    published, err = _dispatch_all(proc, 3)
    assert proc.returncode == 0, err
    assert len(published) == 3, time.monotonic() - started
    warnings = [line for line in err.splitlines() if "cosmos_tls_unverified" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], err
    assert "InsecureRequestWarning" not in err  # said once by us, not once per request
    assert KEY not in err


def test_the_spark_data_source_trusts_the_same_ca_file(
    tls_server: CosmosServer, database: Any
) -> None:
    assert tls_server.tls is not None
    create_container(database, "aggs")
    options = {
        "endpoint": tls_server.endpoint,
        "key": KEY,
        "database": database.id,
        "container": "aggs",
    }
    trusted = CosmosReader({**options, "ca_file": tls_server.tls[0]}, RAW_DOCUMENT_SCHEMA)
    assert len(trusted.partitions()) == 2  # one Spark partition per feed range
    with pytest.raises(ServiceRequestError, match="CERTIFICATE_VERIFY_FAILED"):
        CosmosReader(options, RAW_DOCUMENT_SCHEMA).partitions()
