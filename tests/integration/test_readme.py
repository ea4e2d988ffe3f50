"""Every Python code block of README.md and docs/ runs as written.

Rule: a page's ``python`` blocks run in order, in one namespace (a later block may use what
an earlier one defined), as one test per page. A block that needs a server reads it from
the environment, as a user would: ``MONGODB_URI`` (the session's MongoDB wire server),
``COSMOS_ENDPOINT``/``COSMOS_KEY`` (the session's Cosmos DB account), ``RABBITMQ_URL``
and ``KAFKA_BOOTSTRAP``; this test sets them only for the pages that name them.

The pages name their databases, exchanges, queues and topics with the literals of
:data:`SCRATCH`; each run replaces them with names of its own and deletes only those
afterwards, so it never touches data it did not create.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from azure.cosmos import exceptions
from confluent_kafka.admin import AdminClient
from pymongo import MongoClient

from docoutbox import Outcome
from tests.conftest import missing
from tests.support.kafka import require_kafka
from tests.support.servers import rabbitmq_available, rabbitmq_url

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: Resource names the pages may use: databases ("bank", "shop"), exchanges, queues, topics
#: and consumer groups.
SCRATCH = ("bank", "shop", "shop-events", "orders-inbox", "inventory-inbox", "shop-ledger")

BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def pages() -> list[Path]:
    """README.md and every page of docs/ that holds a Python block."""
    candidates = [README, *sorted(DOCS.rglob("*.md"))]
    return [page for page in candidates if BLOCK.search(page.read_text())]


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_pages_have_snippets() -> None:
    assert README in pages()
    assert len(pages()) > 5


def scratch_source(source: str, suffix: str) -> str:
    """``source`` with every quoted scratch name made unique by ``suffix``."""
    for name in SCRATCH:
        source = source.replace(f'"{name}"', f'"{name}_{suffix}"')
    return source


@contextlib.contextmanager
def mongo_env(request: pytest.FixtureRequest, suffix: str) -> Iterator[dict[str, str]]:

    uri: str = request.getfixturevalue("mongo_uri")
    client: MongoClient[Any] = MongoClient(uri)
    names = [f"{name}_{suffix}" for name in SCRATCH]
    assert not set(names) & set(client.list_database_names())
    try:
        yield {"MONGODB_URI": uri}
    finally:
        for name in names:
            client.drop_database(name)
        client.close()


@contextlib.contextmanager
def cosmos_env(request: pytest.FixtureRequest, suffix: str) -> Iterator[dict[str, str]]:

    account = request.getfixturevalue("cosmos_server")
    client = account.client()
    names = [f"{name}_{suffix}" for name in SCRATCH]
    try:
        yield {"COSMOS_ENDPOINT": account.endpoint, "COSMOS_KEY": account.key}
    finally:
        for name in names:
            with contextlib.suppress(exceptions.CosmosResourceNotFoundError):
                client.delete_database(name)
        client.close()


@contextlib.contextmanager
def rabbitmq_env(suffix: str) -> Iterator[dict[str, str]]:

    url = rabbitmq_url()
    reason = rabbitmq_available(url)
    if reason:
        missing(f"{reason}; run scripts/servers.sh start-rabbitmq")
    try:
        yield {"RABBITMQ_URL": url}
    finally:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        for name in SCRATCH:
            channel.queue_delete(f"{name}_{suffix}")
            channel.exchange_delete(f"{name}_{suffix}")
        connection.close()


@contextlib.contextmanager
def kafka_env(suffix: str) -> Iterator[dict[str, str]]:

    bootstrap = require_kafka()
    try:
        yield {"KAFKA_BOOTSTRAP": bootstrap}
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        existing = set(admin.list_topics(timeout=10).topics)
        ours = [f"{name}_{suffix}" for name in SCRATCH if f"{name}_{suffix}" in existing]
        for future in admin.delete_topics(ours).values() if ours else []:
            future.result(timeout=30)
        groups = {group.group_id for group in admin.list_consumer_groups().result().valid}
        ours = [f"{name}_{suffix}" for name in SCRATCH if f"{name}_{suffix}" in groups]
        for future in admin.delete_consumer_groups(ours).values() if ours else []:
            future.result(timeout=30)


@pytest.mark.wire
@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_page_runs(
    page: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = uuid.uuid4().hex[:10]
    sources = [scratch_source(block, suffix) for block in blocks(page)]
    text = "\n".join(sources)
    for name in SCRATCH:
        assert f'"{name}"' not in text
    with contextlib.ExitStack() as stack:
        for variable in ("MONGODB_URI", "COSMOS_ENDPOINT", "RABBITMQ_URL", "KAFKA_BOOTSTRAP"):
            monkeypatch.delenv(variable, raising=False)
        env: dict[str, str] = {}
        if "MONGODB_URI" in text:
            env |= stack.enter_context(mongo_env(request, suffix))
        if "COSMOS_ENDPOINT" in text:
            env |= stack.enter_context(cosmos_env(request, suffix))
        if "RABBITMQ_URL" in text:
            env |= stack.enter_context(rabbitmq_env(suffix))
        if "KAFKA_BOOTSTRAP" in text:
            env |= stack.enter_context(kafka_env(suffix))
        for variable, value in env.items():
            monkeypatch.setenv(variable, value)
        namespace: dict[str, Any] = {"__name__": f"snippets_{suffix}"}
        for index, source in enumerate(sources):
            code = compile(source, f"{page_id(page)}[{index}]", "exec", dont_inherit=True)
            exec(code, namespace)


def test_outcome_attributes_named_in_readme_exist() -> None:
    """The README's description of ``Outcome`` matches the class."""
    sentence = re.search(r"`Outcome` says ([^;]*);", README.read_text().replace("\n", " "))
    assert sentence is not None
    names = re.findall(r"`(\w+)`", sentence.group(1))
    assert names == ["applied", "duplicate", "gave_up"]
    for name in names:
        assert isinstance(getattr(Outcome, name), property), name
