"""docoutbox inside a FastStream app (``pip install 'docoutbox[faststream]'``).

Rule: a FastStream subscriber that hands its messages to a docoutbox store settles each
message itself, exactly as docoutbox's own consumers do (:mod:`docoutbox.receive`): acked
only after the commit (or as a duplicate the aggregate's inbox recognized), nacked with
requeue when worth another try, rejected when it can never be accepted; the messages its
handler emits go to the aggregate's outbox in the same write. So it must be subscribed
with ``ack_policy=AckPolicy.MANUAL`` (:func:`subscribe` does that). The dispatcher
publishes the outbox through the app's broker object with :class:`FastStreamPublisher`,
and a publish that fails raises: the entry stays in the outbox. Both work under
FastStream's own ``TestRabbitBroker``::

    broker = RabbitBroker(url)
    app = FastStream(broker)
    stock = StoreSubscriber(store, inventory, payload_field("sku"), creates={"Restock"})
    subscribe(broker, "shop.inventory", stock)
    dispatcher = build_async_dispatcher(kit, FastStreamPublisher(broker, exchange="shop"))
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from aiormq.abc import DeliveredMessage
from faststream.middlewares import AckPolicy
from pydantic import BaseModel

from docoutbox.codec import WireFormat, encode
from docoutbox.errors import PublishError
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, Message, OutboxMessage
from docoutbox.receive import (
    Action,
    AnyRejects,
    AsyncReceiver,
    ConsumerStats,
    Delivery,
    HandlerRetry,
    Options,
    Verdict,
    creating_types,
    keep_async,
    log_verdict,
)
from docoutbox.store.api import AsyncAggregateStore

S = TypeVar("S", bound=BaseModel)
log = logging.getLogger("docoutbox.faststream")

__all__ = ["FastStreamPublisher", "StoreSubscriber", "subscribe"]


class StoreSubscriber(Generic[S]):
    """Handle FastStream messages exactly once on ``store``, and settle them.

    Call it with the FastStream message (``RabbitMessage``, or any ``StreamMessage``
    with ``body``, ``headers``, ``content_type``, ``ack``, ``nack`` and ``reject``): the
    body (a docoutbox entry, a CloudEvent, or a plain ``{id, type, payload}``) is handled on
    the aggregate ``route(message)``; a type in ``creates`` may create it. A failing handler
    is retried (``retry``); a rejected message is kept in ``dead_letters`` when given
    (else the queue's dead-letter exchange keeps it). Returns the :class:`Verdict`; raises
    a permanent store error after requeueing its message.
    """

    def __init__(
        self,
        store: AsyncAggregateStore[S],
        handler: Handler[S],
        route: Callable[[Message], AggregateId],
        *,
        creates: Iterable[str] = (),
        retry: HandlerRetry | None = None,
        dead_letters: AnyRejects | None = None,
        requeue_delay: float = 0.05,
        name: str = "faststream",
    ) -> None:
        self.store = store
        self.options = Options(
            retry=retry if retry is not None else HandlerRetry(),
            keep=dead_letters is not None,
            creates=creating_types(creates),
        )
        self.receiver = AsyncReceiver(store, handler, route, self.options, keep=self._keep)
        self.dead_letters = dead_letters
        self.requeue_delay = requeue_delay
        self.name = name
        self.stats = ConsumerStats()
        self._body = b""

    async def _keep(self, _: int, verdict: Verdict) -> None:
        assert self.dead_letters is not None
        await keep_async(self.dead_letters, verdict, self._body, self.name)

    async def __call__(self, message: Any) -> Verdict:
        body = message.body if isinstance(message.body, bytes) else bytes(message.body)
        self._body = body
        delivery = Delivery(body, dict(message.headers or {}), message.content_type)
        verdict = (await self.receiver.receive([delivery]))[0]
        raw = getattr(message, "raw_message", None)
        redelivered = bool(getattr(raw, "redelivered", False))
        self.stats.count(verdict, redelivered)
        log_verdict(
            log, verdict, body, "in the dead letters" if self.dead_letters else "by the queue"
        )
        if verdict.action is Action.ACK:
            await message.ack()
        elif verdict.action is Action.REQUEUE:
            await asyncio.sleep(self.requeue_delay)
            await message.nack()
        else:
            await message.reject()
        if verdict.fatal and verdict.error is not None:
            raise verdict.error
        return verdict


def subscribe(broker: Any, queue: Any, subscriber: StoreSubscriber[Any], **options: Any) -> Any:
    """Subscribe ``subscriber`` to ``queue`` on a FastStream ``broker``, settling manually
    (``ack_policy=AckPolicy.MANUAL``); ``options`` go to ``broker.subscriber``. Returns
    FastStream's subscriber."""
    from faststream.rabbit.annotations import RabbitMessage  # noqa: PLC0415 - the rabbit extra

    async def handle(message: RabbitMessage) -> None:
        await subscriber(message)

    # FastStream reads the annotation to inject the message (not its decoded body); this
    # module's annotations are strings, and RabbitMessage is not a module-level name.
    handle.__annotations__ = {"message": RabbitMessage, "return": None}
    handle.__name__ = f"docoutbox_{subscriber.name}"
    return broker.subscriber(queue, ack_policy=AckPolicy.MANUAL, **options)(handle)


class FastStreamPublisher:
    """Publish outbox entries through a FastStream RabbitMQ broker (an
    :class:`~docoutbox.ports.dispatch.AsyncPublisher`): to ``exchange`` (or the entry's
    own ``destination``), with the entry's type as routing key (or ``routing_key``),
    persistent and mandatory, waiting for the broker's confirm. A failure raises
    :class:`~docoutbox.errors.PublishError`, so the entry stays pending: a refused
    connection, a nack, and a message the broker returns because no queue is bound to
    its exchange and routing key (FastStream hands the return back as the publish's
    result instead of raising it)."""

    def __init__(
        self,
        broker: Any,
        *,
        exchange: str | None = None,
        routing_key: str | None = None,
        wire: WireFormat = WireFormat.PLAIN,
    ) -> None:
        self.broker = broker
        self.exchange = exchange
        self.routing_key = routing_key
        self.wire = wire

    async def publish(self, entry: OutboxMessage) -> None:
        encoded = encode(entry, self.wire)
        headers: dict[str, Any] = {**entry.headers, **encoded.headers("cloudEvents:")}
        try:
            confirmation = await self.broker.publish(
                encoded.body,
                exchange=entry.destination or self.exchange,
                routing_key=self.routing_key or entry.type,
                message_id=entry.id,
                correlation_id=entry.correlation_id,
                headers=headers,
                content_type=encoded.content_type,
                message_type=entry.type,
                persist=True,
                mandatory=True,
            )
        except PublishError:
            raise
        except Exception as exc:
            raise PublishError(
                f"entry {entry.id}: FastStream publish failed: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(confirmation, DeliveredMessage):  # basic.return, confirmed after it
            raise PublishError(
                f"entry {entry.id}: returned unroutable by the broker: no queue is bound to "
                f"exchange {entry.destination or self.exchange or '(default)'!r} with routing "
                f"key {self.routing_key or entry.type!r}"
            )
