"""Dispatchers built from wrong arguments: ``InvalidConfig`` at once, naming what is
wrong, never an ``AttributeError`` from a worker on the first run."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.errors import InvalidConfig
from docoutbox.retry import MAX_COUNT
from docoutbox.store.core import MAX_BATCH
from docoutbox.testing import (
    AsyncMemoryBackend,
    AsyncMemoryPublisher,
    MemoryBackend,
    MemoryPublisher,
)
from docoutbox.testing.dispatch import MemoryCheckpoints
from docoutbox.testing.publisher import MemoryDeadLetters


def sync_ports() -> dict[str, Any]:
    return {
        "backend": MemoryBackend(),
        "publisher": MemoryPublisher(),
        "dead_letters": MemoryDeadLetters(),
    }


def async_ports() -> dict[str, Any]:
    return {
        "backend": AsyncMemoryBackend(),
        "publisher": AsyncMemoryPublisher(),
        "dead_letters": in_thread(MemoryDeadLetters()),
    }


BAD = [
    pytest.param("backend", None, "backend must have load", id="backend-none"),
    pytest.param("publisher", None, "publisher must have publish", id="publisher-none"),
    pytest.param("publisher", "amqp://host", "publisher must have publish", id="publisher-url"),
    pytest.param("dead_letters", object(), "dead_letters must have put", id="dead-letters"),
    pytest.param("source", 42, "source must have start_marker", id="source"),
    pytest.param("checkpoints", {}, "checkpoints must have load", id="checkpoints"),
    pytest.param("config", {"concurrency": 4}, "DispatcherConfig", id="config-dict"),
]


@pytest.mark.parametrize(("name", "value", "why"), BAD)
def test_a_dispatcher_refuses_a_port_it_cannot_call(name: str, value: Any, why: str) -> None:
    with pytest.raises(InvalidConfig, match=why):
        Dispatcher(**(sync_ports() | {name: value}))


@pytest.mark.parametrize(("name", "value", "why"), BAD)
def test_an_async_dispatcher_refuses_a_port_it_cannot_call(name: str, value: Any, why: str) -> None:
    with pytest.raises(InvalidConfig, match=why):
        AsyncDispatcher(**(async_ports() | {name: value}))


def test_a_sync_port_wrapped_for_asyncio_is_checked_through_the_wrapper() -> None:
    with pytest.raises(InvalidConfig, match="publisher must have publish"):
        AsyncDispatcher(**(async_ports() | {"publisher": in_thread(None)}))
    AsyncDispatcher(**(async_ports() | {"checkpoints": in_thread(MemoryCheckpoints())}))


COUNTS = [
    ("concurrency", MAX_COUNT),
    ("run_batch", MAX_COUNT),
    ("max_outstanding", MAX_COUNT),
    ("max_backlog", MAX_COUNT),
    # Sent to the database as page sizes: the store's own page bound.
    ("batch_size", MAX_BATCH),
    ("sweep_page", MAX_BATCH),
]


@pytest.mark.parametrize(("name", "high"), COUNTS)
def test_a_count_past_its_bound_is_refused_at_once(name: str, high: int) -> None:
    # A sweep page of 10**20 was accepted, then every sweep died in the driver
    # ("MongoDB can only handle up to 8-byte ints"), stopping the dispatcher.
    with pytest.raises(InvalidConfig, match=f"DispatcherConfig.{name} must be between 1 and"):
        DispatcherConfig(**{name: high + 1})
    assert getattr(DispatcherConfig(**{name: high}), name) == high
