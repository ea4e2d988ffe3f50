"""A scratch shop for the example's tests: a RabbitMQ exchange and queues, and a database
(MongoDB on the wire server, or Cosmos DB on the local server), deleted afterwards."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from azure.cosmos import PartitionKey
from pymongo import MongoClient

from benchmarks.rabbit import Sandbox, sandbox
from docoutbox import AggregateStore
from docoutbox.ports.kit import StoreSettings
from docoutbox_app import registry
from examples.order_inventory import domain, topology
from tests.support.e2e import require_rabbitmq


@dataclass
class Shop:
    """Where the example runs: ``store`` is ``mongo`` or ``cosmos`` (the example module)."""

    name: str
    url: str
    box: Sandbox
    store: str
    settings: StoreSettings

    def command(self, body: dict[str, Any], times: int = 1) -> None:
        """Publish a command ``times`` times to the shop's exchange, by its type."""

        with pika.BlockingConnection(pika.URLParameters(self.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for _ in range(times):
                channel.basic_publish(self.name, body["type"], json.dumps(body).encode())

    def read(self, collection: str, model: type[Any], ids: list[str]) -> dict[str, Any]:
        """The states of ``ids`` that exist, and ``"pending"``: every outbox entry left in
        the collection."""
        kit = registry.store(self.store).open(
            StoreSettings(**{**self.settings.__dict__, "collection": collection})
        )
        try:
            store = AggregateStore(kit.backend, model)
            found: dict[str, Any] = {}
            for aggregate_id in ids:
                snapshot = store.load(aggregate_id)
                if snapshot is not None:
                    found[aggregate_id] = snapshot.state
            found["pending"] = [e for s in store.pending() for e in s.outbox]
            return found
        finally:
            kit.close()

    def orders(self, count: int) -> dict[str, Any]:
        return self.read("orders", domain.Order, [f"o-{n}" for n in range(count)])

    def stock(self) -> dict[str, Any]:
        return self.read("stock", domain.Stock, ["apple"])


@pytest.fixture(params=["mongo", "cosmos"])
def shop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    url = require_rabbitmq()
    name = f"shop_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("SHOP", name)
    monkeypatch.setenv("RABBITMQ_URL", url)
    with sandbox(url) as box:
        topology.declare(url, name)
        box.exchanges.append(name)
        box.queues += [f"{name}.orders", f"{name}.inventory"]
        if request.param == "mongo":
            uri: str = request.getfixturevalue("mongo_uri")
            monkeypatch.setenv("MONGODB_URI", uri)
            yield Shop(name, url, box, "mongo", StoreSettings(uri, name, "orders"))

            with MongoClient(uri) as client:
                client.drop_database(name)
            return
        account = request.getfixturevalue("cosmos_server")
        if not account.endpoint.startswith("http://"):
            pytest.skip("the example's Cosmos test runs on the local server")
        monkeypatch.setenv("COSMOS_ENDPOINT", account.endpoint)
        monkeypatch.setenv("COSMOS_KEY", account.key)

        client = account.client()
        database = client.create_database(name)
        try:
            for container in ("orders", "stock"):
                database.create_container(container, PartitionKey(path="/id"))
            settings = StoreSettings(account.endpoint, name, "orders", key=account.key)
            yield Shop(name, url, box, "cosmos", settings)
        finally:
            client.delete_database(name)
            client.close()
