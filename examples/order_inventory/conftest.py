"""Scratch RabbitMQ exchange and queues and a scratch database for the example's tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from examples.order_inventory import topology
from tests.support.e2e import Sandbox, require_rabbitmq, sandbox


@pytest.fixture
def shop(monkeypatch: pytest.MonkeyPatch, mongo_uri: str) -> Iterator[tuple[str, str, Sandbox]]:
    url = require_rabbitmq()
    name = f"shop_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("SHOP", name)
    monkeypatch.setenv("MONGODB_URL", mongo_uri)
    monkeypatch.setenv("RABBITMQ_URL", url)
    with sandbox(url) as box:
        topology.declare(url, name)
        box.exchanges.append(name)
        box.queues += [f"{name}.orders", f"{name}.inventory"]
        yield name, url, box
    from pymongo import MongoClient

    with MongoClient(mongo_uri) as client:
        client.drop_database(name)


def command(url: str, shop: str, body: dict[str, Any], times: int) -> None:
    import pika

    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for _ in range(times):
            channel.basic_publish(shop, body["type"], json.dumps(body).encode())


def documents(mongo_uri: str, shop: str, collection: str) -> list[dict[str, Any]]:
    from pymongo import MongoClient

    with MongoClient(mongo_uri) as client:
        return list(client[shop][collection].find())
