"""The dispatcher's MongoDB-specific behaviour on the wire server. What every backend
shares (stream, checkpoints, sweeps, dead letters) is in ``test_dispatch_backends.py``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient, monitoring

from docoutbox.errors import ChangeStreamLost
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource
from tests.support.backends import DispatchEnv, dispatch_env_of, wait_until

pytestmark = pytest.mark.wire


@pytest.fixture
def env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    with dispatch_env_of("mongo", request) as made:
        yield made


def test_unresumable_positions_are_classified_as_stream_loss(env: DispatchEnv) -> None:
    source = MongoChangeSource(env.coll)
    for bad in [{"resume_after": {"_data": "garbage"}}, {"resume_after": {}}, {"x": 1}, 42]:
        with pytest.raises(ChangeStreamLost):
            source.open(bad)
    marker = source.start_marker()
    source.open(marker)
    env.write("a", "m0")
    wait_until(lambda: bool(events := source.poll(10)) and events[0].document is not None)
    source.close()


class Commands(monitoring.CommandListener):
    """The names of the commands a client sent."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        return None

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        return None


def test_the_first_poll_after_opening_sends_no_get_more_when_the_opening_brought_nothing(
    mongo_uri: str,
) -> None:
    """The opening's reply is the server's answer of a moment ago; on the wire server
    every getMore scans the whole oplog."""
    commands = Commands()
    database = f"stream_open_{uuid.uuid4().hex[:8]}"
    with MongoClient(mongo_uri, event_listeners=[commands]) as client:
        try:
            source = MongoChangeSource(client[database]["docs"])
            source.open(source.start_marker())
            commands.names.clear()
            assert source.poll(10) == []
            assert commands.names == []
            assert source.poll(10) == []
            assert commands.names == ["getMore"]
            source.close()
        finally:
            client.drop_database(database)


def test_the_async_source_skips_the_same_get_more(mongo_uri: str) -> None:
    commands = Commands()
    database = f"stream_open_{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        client: AsyncMongoClient[Any] = AsyncMongoClient(mongo_uri, event_listeners=[commands])
        try:
            source = AsyncMongoChangeSource(client[database]["docs"])
            await source.open(await source.start_marker())
            commands.names.clear()
            assert await source.poll(10) == []
            assert commands.names == []
            assert await source.poll(10) == []
            assert commands.names == ["getMore"]
            await source.close()
        finally:
            await client.drop_database(database)
            await client.close()

    asyncio.run(scenario())
