"""The asyncio Kafka consumer, on confluent-kafka's own ``AIOConsumer``.

It shares everything but the I/O with :class:`~docoutbox_kafka.KafkaConsumer`: the
settings, offsets, dead-letter records, counts and logs
(:class:`~docoutbox_kafka.consumer.KafkaSettlement`), and what to do with each record
(:func:`docoutbox.receive.receive_flow`, driven by :class:`~docoutbox.receive.AsyncReceiver`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from confluent_kafka import Message as Record
from confluent_kafka import TopicPartition
from pydantic import BaseModel

from docoutbox.handlers import Handler
from docoutbox.receive import AnyRejects, AsyncReceiver, Stop, Verdict, keep_async
from docoutbox.store.api import AsyncAggregateStore
from docoutbox_kafka.consumer import ConsumerStats, KafkaSettlement, _is_async, log
from docoutbox_kafka.errors import translated

try:
    from confluent_kafka.aio import AIOConsumer
except ImportError:  # confluent-kafka 2.12 shipped it as experimental
    from confluent_kafka.experimental.aio import (  # type: ignore[no-redef, import-not-found, unused-ignore]
        AIOConsumer,
    )

S = TypeVar("S", bound=BaseModel)


class AsyncKafkaConsumer(KafkaSettlement[AsyncAggregateStore[S], AnyRejects], Generic[S]):
    """The asyncio twin of :class:`~docoutbox_kafka.KafkaConsumer`, over an
    :class:`~docoutbox.AsyncAggregateStore`, with the same options and guarantees: a poll's
    records handled per aggregate (``handle_batch``), failing handlers retried, rejects
    kept (``dead_letter_topic`` and/or ``dead_letters``, sync or async), offsets
    committed only after the writes. The blocking client calls run in
    ``AIOConsumer``'s worker threads, the dead-letter topic's writes in
    ``asyncio.to_thread``.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        topics: Sequence[str] | str,
        group: str,
        store: AsyncAggregateStore[S],
        handler: Handler[S],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **options: Any,
    ) -> None:
        super().__init__(config, topics, group, store, handler, **options)
        self._sleep = sleep
        self._consumer: AIOConsumer | None = None

    async def run(
        self,
        *,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        stop: Stop | None = None,
        poll: float = 0.1,
    ) -> ConsumerStats:
        """As :meth:`KafkaConsumer.run <docoutbox_kafka.KafkaConsumer.run>`."""
        consumer = await self._open()
        loop = asyncio.get_running_loop()
        count = 0
        idle_since = loop.time()
        try:
            while True:
                with translated(f"consume {self.topics} as group {self.group!r}"):
                    polled = await consumer.consume(self._want(count, max_messages), poll)
                records = self._usable(polled)
                if not records:
                    stopped = stop is not None and stop.is_set()
                    idle = idle_timeout is not None and loop.time() - idle_since >= idle_timeout
                    if stopped or idle:
                        break
                    if self.offsets.due():
                        await self.commit()
                    continue
                await self._handle(consumer, records)
                count += len(records)
                idle_since = loop.time()
                if self.offsets.due():
                    await self.commit()
                if self._stopping(stop, max_messages, count):
                    break
        finally:
            await self.commit()
        return self.stats

    async def _handle(self, consumer: AIOConsumer, records: list[Record]) -> None:
        async def keep(index: int, verdict: Verdict) -> None:
            record = records[index]
            await asyncio.to_thread(self._dead_letter, record, verdict)
            if self.dead_letters is not None and _is_async(self.dead_letters):
                await keep_async(
                    self.dead_letters, verdict, record.value() or b"", self._origin(record)
                )

        receiver: AsyncReceiver[S] | None = self._receiver
        if receiver is None:
            receiver = self._receiver = AsyncReceiver(
                self.store, self.handler, self.aggregate_id_of, self._options(), sleep=self._sleep
            )
        verdicts = await receiver.receive(self._deliveries(records), keep=keep)
        settled = self._settle(records, verdicts)
        for topic, partition, offset in settled.rewind:
            with translated(f"rewind {topic}[{partition}] to {offset}"):
                await consumer.seek(TopicPartition(topic, partition, offset))
        if settled.error is not None:
            raise settled.error
        if settled.rewind:
            await self._sleep(self.requeue_delay)

    async def commit(self, consumer: AIOConsumer | None = None) -> None:
        """Commit the offsets of every settled record (synchronously)."""
        consumer = consumer or self._consumer
        offsets = self.offsets.to_commit()
        if consumer is None or not offsets:
            return
        with translated(f"commit offsets of group {self.group!r}"):
            await consumer.commit(offsets=self._committing(offsets), asynchronous=False)
        self._committed(offsets)

    async def close(self) -> None:
        """Commit what was settled and leave the group."""
        try:
            await self.commit()
        finally:
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                await consumer.close()
            await asyncio.to_thread(self._close_producer)

    async def _open(self) -> AIOConsumer:
        if self._consumer is None:
            with translated(f"create a Kafka consumer for group {self.group!r}"):
                consumer = AIOConsumer(dict(self._settings, logger=log))
                await consumer.subscribe(self.topics, on_revoke=self._on_revoke)
            self._consumer = consumer
        return self._consumer

    async def _on_revoke(self, consumer: AIOConsumer, partitions: list[TopicPartition]) -> None:
        """Commit what was settled on partitions handed to another member, then forget them."""
        try:
            await self.commit(consumer)
        except Exception as exc:  # noqa: BLE001 - the records come again: duplicates, no loss
            log.warning("could not commit before a rebalance: %s", exc)
        self.offsets.forget(partitions)
