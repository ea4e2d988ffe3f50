"""Fixtures shared by the integration tests: RabbitMQ publishers, MongoDB, and the bundles
that run one test on every database backend (the broker sandboxes ``box`` and ``topics``
are in ``tests/conftest.py``, shared with the contract tier)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox_rabbitmq import RabbitPublisher
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from tests.support.aio import Blocking
from tests.support.backends import (
    BACKENDS,
    DISPATCH_DRIVERS,
    Bundle,
    DispatchEnv,
    bundle_of,
    dispatch_env_of,
)

#: The RabbitMQ publishers and consumers that share one contract suite.
RABBITMQ_CLIENTS = ["pika", "aio-pika"]


@pytest.fixture
def mongo(mongo_uri: str) -> Iterator[Any]:
    """A scratch MongoDB database on the test server, dropped afterwards."""

    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    name = f"it_{uuid.uuid4().hex[:8]}"
    yield client[name]
    client.drop_database(name)
    client.close()


@pytest.fixture(params=RABBITMQ_CLIENTS)
def make_publisher(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of RabbitMQ publishers of one client library, all closed afterwards.

    The aio-pika publisher runs on its own event loop.
    """

    made: list[Any] = []

    def make(url: str, exchange: str = "", **options: Any) -> Any:
        if request.param == "pika":
            publisher: Any = RabbitPublisher(url, exchange, **options)
        else:
            publisher = Blocking(AsyncRabbitPublisher(url, exchange, **options))
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        publisher.close()


@pytest.fixture(params=BACKENDS)
def bundle(request: pytest.FixtureRequest) -> Iterator[Bundle]:
    """A scratch database on each backend's session server (tests/support/backends.py)."""
    with bundle_of(request.param, request) as made:
        yield made


@pytest.fixture(params=DISPATCH_DRIVERS)
def dispatch_env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    """Dispatchers over a scratch database, for every (backend, driver)."""
    kind, driver = request.param
    with dispatch_env_of(kind, request, driver) as made:
        yield made
