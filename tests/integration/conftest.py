"""Fixtures shared by the integration tests that cross MongoDB and RabbitMQ."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.e2e import Sandbox, require_rabbitmq, sandbox


@pytest.fixture
def box() -> Iterator[Sandbox]:
    """A private RabbitMQ exchange and queues, deleted afterwards."""
    with sandbox(require_rabbitmq()) as created:
        yield created


@pytest.fixture
def mongo(mongo_uri: str) -> Iterator[Any]:
    """A scratch MongoDB database on the test server, dropped afterwards."""
    from pymongo import MongoClient

    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    name = f"it_{uuid.uuid4().hex[:8]}"
    yield client[name]
    client.drop_database(name)
    client.close()


@pytest.fixture(scope="session")
def kafka() -> str:
    """The bootstrap servers of the shared test Kafka broker."""
    from tests.support.kafka import require_kafka

    return require_kafka()


@pytest.fixture
def topics(kafka: str) -> Iterator[Any]:
    """Private Kafka topics, deleted afterwards."""
    from tests.support.kafka import Topics

    created = Topics(kafka)
    yield created
    created.close()
