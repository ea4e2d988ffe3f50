"""Misused store API: a typed ``InvalidConfig``/``InvalidMessage`` before anything is
written, never a bare TypeError or AttributeError from inside the store."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox import AggregateStore, AsyncAggregateStore, Message, StoreConfig
from docoutbox.dispatch.extras.local import LocalPublisher, Route
from docoutbox.errors import InvalidConfig, InvalidMessage
from docoutbox.store.document import partition_of
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.contract import Counter, counter_handlers
from tests.support import loopless

MESSAGE = Message(id="m-1", type="Add", payload={"n": 1})


def refused_before_any_write(match: str, group_commit: bool, handler: Any, create: Any) -> None:
    """``handle`` and ``handle_batch`` both raise ``InvalidConfig`` and write nothing."""
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter, group_commit=group_commit)
    with pytest.raises(InvalidConfig, match=match):
        store.handle("c-1", MESSAGE, handler, create=create)
    with pytest.raises(InvalidConfig, match=match):
        store.handle_batch("c-1", [MESSAGE], handler, create=create)
    assert backend.changes == []


@pytest.mark.parametrize("handler", [None, {"Add": counter_handlers}, "Add", 42])
@pytest.mark.parametrize("group_commit", [False, True])
def test_a_handler_that_is_not_callable_is_refused_before_any_write(
    handler: Any, group_commit: bool
) -> None:
    refused_before_any_write("handler must be callable", group_commit, handler, True)


def test_an_async_store_refuses_a_handler_that_is_not_callable() -> None:
    backend = AsyncMemoryBackend()
    store = AsyncAggregateStore(backend, Counter)

    async def run() -> None:
        with pytest.raises(InvalidConfig, match="handler must be callable"):
            await store.handle("c-1", MESSAGE, None, create=True)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage, match="sequence of messages"):
            await store.handle_batch("c-1", None, counter_handlers, create=True)  # type: ignore[arg-type]

    loopless.run(run())
    assert backend.sync.changes == []


@pytest.mark.parametrize("messages", [None, 5, "m-1", {"id": "m-1", "type": "Add"}, MESSAGE])
def test_handle_batch_refuses_what_is_not_a_sequence_of_messages(messages: Any) -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    with pytest.raises(InvalidMessage, match="sequence of messages"):
        store.handle_batch("c-1", messages, counter_handlers, create=True)
    assert backend.changes == []


@pytest.mark.parametrize(
    ("backend", "model", "config"),
    [
        pytest.param(None, Counter, None, id="no-backend"),
        pytest.param(object(), Counter, None, id="not-a-backend"),
        pytest.param(MemoryBackend(), Counter(), None, id="model-instance"),
        pytest.param(MemoryBackend(), dict, None, id="model-not-pydantic"),
        pytest.param(MemoryBackend(), Counter, {"partitions": 4}, id="config-dict"),
        pytest.param(MemoryBackend(), Counter, StoreConfig, id="config-class"),
    ],
)
@pytest.mark.parametrize("store_class", [AggregateStore, AsyncAggregateStore])
def test_a_store_built_from_wrong_arguments_is_refused_at_once(
    store_class: Any, backend: Any, model: Any, config: Any
) -> None:
    with pytest.raises(InvalidConfig):
        store_class(backend, model, config)


def test_a_sync_store_over_an_async_backend_is_refused_at_once() -> None:
    """It returned coroutines to the flow: AttributeError on the first handle."""
    with pytest.raises(InvalidConfig, match="sync backend"):
        AggregateStore(AsyncMemoryBackend(), Counter)  # type: ignore[arg-type]


def test_an_async_store_over_a_sync_backend_is_refused_at_once() -> None:
    """It awaited plain results: TypeError on the first handle."""
    with pytest.raises(InvalidConfig, match="async backend"):
        AsyncAggregateStore(MemoryBackend(), Counter)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "routes",
    [
        None,
        ["Stock"],
        {"Stock": 5},
        {"Stock": Route(AggregateStore(MemoryBackend(), Counter), None)},  # type: ignore[arg-type]
    ],
    ids=["none", "list", "not-a-route", "handler-none"],
)
def test_a_local_publisher_refuses_routes_it_cannot_follow(routes: Any) -> None:
    """These were AttributeErrors, or accepted and failed at the first publish."""
    with pytest.raises(InvalidConfig):
        LocalPublisher(routes)


@pytest.mark.parametrize("partitions", [0, -1, 2.0, "16", None])
def test_partition_of_refuses_a_partition_count_that_is_not_a_positive_int(
    partitions: Any,
) -> None:
    with pytest.raises(InvalidConfig, match="partitions"):
        partition_of("a", partitions)  # was ZeroDivisionError for 0


@pytest.mark.parametrize("model", [int, dict, Counter(), None])
def test_payload_as_refuses_what_is_not_a_pydantic_model_class(model: Any) -> None:
    with pytest.raises(InvalidConfig, match="payload_as"):
        MESSAGE.payload_as(model)  # was an AttributeError on model_validate


@pytest.mark.parametrize("create", ["no", "false", 1, None])
@pytest.mark.parametrize("group_commit", [False, True])
def test_create_must_be_a_bool(create: Any, group_commit: bool) -> None:
    """create="no" is truthy: it created the aggregate."""
    refused_before_any_write("create must be a bool", group_commit, counter_handlers, create)
