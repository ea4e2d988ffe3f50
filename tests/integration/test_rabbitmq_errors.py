"""Pika error translation and the consumer's settle decisions; no broker needed."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiormq.exceptions as ax
import pika.exceptions as px
import pytest
from pamqp.commands import Basic as AioBasic
from pika.adapters.blocking_connection import ReturnedMessage
from pika.spec import Basic, BasicProperties

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from docoutbox import AggregateStore, InboxPolicy, StoreConfig
from docoutbox.errors import (
    BrokerUnavailable,
    ConcurrencyConflict,
    DocOutboxError,
    DocumentTooLarge,
    InboxSaturated,
    PermanentPublishError,
    PermanentStoreError,
    PublishError,
    TransientStoreError,
)
from docoutbox.receive import Action
from docoutbox.retry import RetryPolicy
from docoutbox_rabbitmq import RabbitConsumer, RabbitPublisher, aio
from docoutbox_rabbitmq.aio import AsyncRabbitPublisher
from docoutbox_rabbitmq.amqp import masked
from docoutbox_rabbitmq.errors import translate, translated
from tests.support.e2e import FaultyBackend


def returned(code: int) -> ReturnedMessage:
    method = Basic.Return(reply_code=code, reply_text="NO_ROUTE", exchange="x", routing_key="k")
    return ReturnedMessage(method, BasicProperties(), b"")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (px.UnroutableError([returned(312)]), PublishError),
        (px.NackError([returned(0)]), PublishError),
        (px.ChannelClosedByBroker(406, "PRECONDITION_FAILED"), PermanentPublishError),
        (px.ChannelClosedByBroker(311, "CONTENT_TOO_LARGE"), PermanentPublishError),
        (px.ChannelClosedByBroker(404, "NOT_FOUND - no exchange"), PermanentPublishError),
        (px.ChannelClosedByBroker(403, "ACCESS_REFUSED"), BrokerUnavailable),
        (px.ChannelClosedByBroker(506, "RESOURCE_ERROR"), PublishError),
        (px.ConnectionClosedByBroker(320, "CONNECTION_FORCED"), BrokerUnavailable),
        (px.StreamLostError("Transport indicated EOF"), BrokerUnavailable),
        (px.AMQPHeartbeatTimeout("missed"), BrokerUnavailable),
        (px.ConnectionBlockedTimeout("blocked"), BrokerUnavailable),
        (px.ProbableAuthenticationError("auth"), BrokerUnavailable),
        (px.ChannelWrongStateError("closed"), BrokerUnavailable),
        (ConnectionRefusedError(111, "refused"), BrokerUnavailable),
        (px.InvalidFrameError("bad frame"), PublishError),
    ],
)
def test_translation_by_class_and_reply_code(error: Exception, expected: type) -> None:
    translated_error = translate(error, "publish e1")
    assert type(translated_error) is expected
    assert str(translated_error).startswith("publish e1: ")
    with pytest.raises(expected) as caught, translated("publish e1"):
        raise error
    assert caught.value.__cause__ is error


def test_non_broker_errors_pass_through_untouched() -> None:
    with pytest.raises(KeyError), translated("publish"):
        raise KeyError("not ours")


def test_masked() -> None:
    assert masked("amqp://u:p%40ss@h:5672/v") == "amqp://u:***@h:5672/v"
    assert masked("amqp://h:5672/") == "amqp://h:5672/"


def consumer(backend: Any, config: StoreConfig | None = None) -> RabbitConsumer[Ledger]:
    store = AggregateStore(backend, Ledger, config or StoreConfig())
    return RabbitConsumer(
        "amqp://guest:guest@127.0.0.1:1/%2F",
        "q",
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        create=True,
    )


def body(**fields: Any) -> bytes:
    return make_entry(**fields).model_dump_json().encode()


def test_decide_acks_applied_and_duplicate() -> None:
    worker = consumer(FaultyBackend())
    first = worker.decide(body(id="m1"))
    again = worker.decide(body(id="m1"))
    assert (first.action, again.action) == (Action.ACK, Action.ACK)
    assert first.outcome is not None and first.outcome.applied
    assert again.outcome is not None and again.outcome.duplicate


@pytest.mark.parametrize(
    "payload",
    [b"\xff\xfe", b"[]", b'{"id": "m"}', b"null"],
)
def test_decide_rejects_undecodable_bodies(payload: bytes) -> None:
    verdict = consumer(FaultyBackend()).decide(payload)
    assert verdict.action is Action.REJECT and verdict.message is None
    assert isinstance(verdict.error, DocOutboxError)


@pytest.mark.parametrize(
    ("error", "action", "fatal"),
    [
        (TransientStoreError("down"), Action.REQUEUE, False),
        (ConcurrencyConflict("raced"), Action.REQUEUE, False),
        (InboxSaturated("gap"), Action.REQUEUE, False),
        (PermanentStoreError("auth"), Action.REQUEUE, True),
        (DocumentTooLarge("a"), Action.REJECT, False),
        (RuntimeError("bug"), Action.REJECT, False),
    ],
)
def test_decide_by_error(error: Exception, action: Action, fatal: bool) -> None:
    backend = FaultyBackend()
    backend.load_errors = [error] * 20
    verdict = consumer(backend).decide(body())
    assert (verdict.action, verdict.fatal) == (action, fatal)
    assert verdict.message is not None


def test_decide_requeues_gave_up() -> None:
    backend = FaultyBackend()
    backend.refuse_writes = 1
    config = StoreConfig(inbox=InboxPolicy(), retry=RetryPolicy(1))
    verdict = consumer(backend, config).decide(body())
    assert verdict.action is Action.REQUEUE and verdict.outcome is not None
    assert verdict.outcome.status == "gave_up"


def test_decide_rejects_a_missing_aggregate_without_create() -> None:
    worker = consumer(FaultyBackend())
    worker.create = False
    assert worker.decide(body()).action is Action.REJECT


def aio_returned(code: int) -> Any:
    return AioBasic.Return(reply_code=code, reply_text="NO_ROUTE", exchange="x", routing_key="k")


def aio_errors() -> list[tuple[BaseException, type]]:
    return [
        (ax.DeliveryError(None, aio_returned(312)), PublishError),
        (ax.DeliveryError(None, AioBasic.Nack(delivery_tag=1)), PublishError),
        (ax.ChannelPreconditionFailed("PRECONDITION_FAILED"), PermanentPublishError),
        (ax.ChannelClosed(311, "CONTENT_TOO_LARGE"), PermanentPublishError),
        (ax.ChannelNotFoundEntity("NOT_FOUND - no exchange"), PermanentPublishError),
        (ax.ChannelAccessRefused("ACCESS_REFUSED"), BrokerUnavailable),
        (ax.ChannelLockedResource("RESOURCE_LOCKED"), BrokerUnavailable),
        (ax.ChannelClosed(506, "RESOURCE_ERROR"), PublishError),
        (ax.ChannelClosed(None, None), BrokerUnavailable),
        (ax.ConnectionClosed(320, "CONNECTION_FORCED"), BrokerUnavailable),
        (ax.AMQPConnectionError("Server connection unexpectedly closed"), BrokerUnavailable),
        (ax.ChannelInvalidStateError("closed"), BrokerUnavailable),
        (ConnectionRefusedError(111, "refused"), BrokerUnavailable),
        (TimeoutError(), BrokerUnavailable),
        (ax.InvalidFrameError("bad frame"), PublishError),
    ]


@pytest.mark.parametrize("case", range(len(aio_errors())))
def test_aio_translation_maps_onto_the_same_codes(case: int) -> None:
    """aio-pika's exceptions reach the same docoutbox errors as pika's for each reply code."""
    error, expected = aio_errors()[case]
    translated_error = aio.translate(error, "publish e1")
    assert type(translated_error) is expected
    assert str(translated_error).startswith("publish e1: ")


def _closed_port() -> int:

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_broker_that_is_down_is_named_with_its_cause_in_one_line() -> None:
    """pika and aiormq raise AMQPConnectionError with no text of their own: the error
    says where (the masked URL, with host and port) and why (refused), in one line."""

    port = _closed_port()
    url = f"amqp://guest:secret@127.0.0.1:{port}/%2F"
    with RabbitPublisher(url, "ex") as publisher, pytest.raises(BrokerUnavailable) as caught:
        publisher.check()
    text = str(caught.value)
    assert "connection failed: connection refused (AMQPConnectionError)" in text
    assert f"127.0.0.1:{port}" in text and "secret" not in text and "\n" not in text

    async def aio() -> str:
        publisher = AsyncRabbitPublisher(url, "ex")
        try:
            with pytest.raises(BrokerUnavailable) as failed:
                await publisher.check()
        finally:
            await publisher.close()
        return str(failed.value)

    text = asyncio.run(aio())
    assert "connection failed: connection refused (AMQPConnectionError)" in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (px.AMQPConnectionError(), "no reason given"),
        (TimeoutError(), "timed out"),
        (ConnectionResetError(104, "reset"), "connection reset"),
        (px.StreamLostError("Transport indicated EOF"), "Transport indicated EOF"),
    ],
)
def test_connection_causes(error: Exception, cause: str) -> None:
    assert f"connection failed: {cause} (" in str(translate(error, "connect"))
