"""An endpoint's dispatcher and its own commits, on RabbitMQ and the wire server: the
change stream is read less often while it brings nothing (``max_stream_wait``), and a
commit of the endpoint's consumers that added entries has it read at once (a nudge), while
a commit that added none does not."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pika
import pytest
from pymongo import MongoClient

from benchmarks.ledger import make_entry
from docoutbox import Aggregate, Decision, Handlers, InboxPolicy, Message, StoreConfig, emit
from docoutbox.codec import encode_entry
from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.testing import MemoryPublisher
from docoutbox_app.endpoint import Endpoint, RabbitQueue, Store, payload_field
from docoutbox_app.endpoint.runtime import STREAM_WAIT, Observation, run_endpoint
from docoutbox_app.wiring import DispatchOptions

pytestmark = [pytest.mark.rabbitmq, pytest.mark.wire]


class Tally(Aggregate):
    seen: int = 0


tally: Handlers[Tally] = Handlers()


@tally.on("Count")
def count(state: Tally, message: Message) -> Decision[Tally]:
    return Decision(Tally(seen=state.seen + 1), emit("Counted", {"n": state.seen + 1}))


@tally.on("Note")
def note(state: Tally, message: Message) -> Decision[Tally]:
    return Decision(Tally(seen=state.seen + 1))  # a commit that adds no entry


def send(url: str, queue: str, kinds: list[str]) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n, kind in enumerate(kinds):
            entry = make_entry("producer", n + 1, type=kind)
            entry = entry.model_copy(update={"payload": {"tally": f"t-{n % 2}"}})
            channel.basic_publish("", queue, encode_entry(entry))


def run(
    box: Any, mongo_uri: str, kinds: list[str], dispatch: DispatchOptions | None = None
) -> tuple[AsyncDispatcher, int, MemoryPublisher]:
    """Run an endpoint until it handled ``kinds`` and published what they emitted: its
    dispatcher, how many times it was nudged, and what it published."""
    _, queue, _ = box.names(exchange=False)
    box.channel.queue_declare(queue, durable=True)
    published = MemoryPublisher()
    database = f"endpoint_stream_{uuid.uuid4().hex[:8]}"
    endpoint: Endpoint[Any] = Endpoint(
        "tallies",
        Tally,
        tally,
        store=Store("mongo", mongo_uri, database, "tallies"),
        inputs=[
            RabbitQueue(
                queue=queue, url=box.url, route=payload_field("tally"), creates={"Count", "Note"}
            )
        ],
        output=published,
        config=StoreConfig(inbox=InboxPolicy(window=0, exact=True)),
        dispatch=dispatch,
    )
    seen: list[AsyncDispatcher] = []
    nudges = [0]

    def started(dispatcher: AsyncDispatcher) -> None:
        seen.append(dispatcher)
        nudge = dispatcher.nudge

        def counted() -> None:
            nudges[0] += 1
            nudge()

        dispatcher.nudge = counted  # type: ignore[method-assign]

    async def scenario() -> None:
        stop = asyncio.Event()
        observation = Observation()
        running = asyncio.create_task(
            run_endpoint(endpoint, endpoint.settings(), stop, observation, started=started)
        )
        await asyncio.to_thread(send, box.url, queue, kinds)
        deadline = time.monotonic() + 60
        emitted = kinds.count("Count")
        while time.monotonic() < deadline and not running.done():
            stats = observation.health.endpoints["tallies"].stats.get(f"rabbitmq:{queue}")
            if stats and stats.applied == len(kinds) and len(published.published) == emitted:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await running

    try:
        asyncio.run(scenario())
    finally:
        with MongoClient(mongo_uri) as client:
            client.drop_database(database)
    return seen[0], nudges[0], published


def test_each_commit_that_added_entries_nudges_the_dispatcher(box: Any, mongo_uri: str) -> None:
    kinds = ["Count", "Note", "Count", "Note", "Note", "Count"]
    dispatcher, nudges, published = run(box, mongo_uri, kinds)
    assert nudges == 3  # the Notes added no entry
    assert sorted(e.payload["n"] for e in published.published) == [1, 2, 3]
    assert dispatcher.config.max_stream_wait == STREAM_WAIT


def test_an_endpoint_keeps_the_max_stream_wait_it_was_given(box: Any, mongo_uri: str) -> None:
    dispatcher, _, published = run(box, mongo_uri, ["Count"], DispatchOptions(max_stream_wait=0.05))
    assert dispatcher.config.max_stream_wait == 0.05
    assert len(published.published) == 1
