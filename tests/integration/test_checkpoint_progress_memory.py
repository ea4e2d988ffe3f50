"""The checkpoint keeps advancing while producers commit continuously, without ever passing
an event whose entries are not yet published (I5): the threaded and the asyncio dispatcher
on the wall clock, over the in-memory world of ``tests/unit/test_checkpoint_progress.py``
(which steps the engine on a simulated clock). The integration twins on the MongoDB wire
server and Cosmos DB feed-range leases are in ``tests/integration/test_checkpoint_progress.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from docoutbox import OutboxMessage
from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.ports.dispatch import Ownership
from docoutbox.testing import MemoryPublisher
from docoutbox.testing.memory import AsyncMemoryBackend
from tests.support.checkpointing import BOUND, HotTraffic
from tests.unit.test_checkpoint_progress import HOT, Acquiring, World

# -- the engine on a simulated clock --------------------------------------------------


# -- the threaded and asyncio dispatchers ---------------------------------------------


@pytest.fixture(params=["threaded", "async"])
def driver(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture
def world() -> World:
    return World()


#: How long a publish takes: a hot aggregate's run is often still under way when its next
#: commits arrive, so its runs are coalesced into follow-ups.
PUBLISH_TIME = 0.001


class SlowPublisher:
    """Publishes to ``world.publisher`` after :data:`PUBLISH_TIME`, without blocking the
    event loop (as an async broker client waits for its confirm)."""

    def __init__(self, sync: MemoryPublisher) -> None:
        self.sync = sync

    async def publish(self, entry: OutboxMessage) -> None:
        await asyncio.sleep(PUBLISH_TIME)
        self.sync.publish(entry)


def slow_publish(entry: object) -> None:
    time.sleep(PUBLISH_TIME)


def start(
    world: World, driver: str, ownership: Ownership | None = None
) -> tuple[Dispatcher | AsyncDispatcher, threading.Thread]:
    """A dispatcher on its own thread, each publish taking :data:`PUBLISH_TIME`.

    The asyncio one gets async ports, as in production: calling sync ones in worker
    threads, next to the producers' threads, makes each call wait for the GIL.
    """
    config = DispatcherConfig(
        name="d", concurrency=4, poll_interval=0.005, checkpoint_interval=0.1, grace=0
    )
    dispatcher: Dispatcher | AsyncDispatcher
    if driver == "threaded":
        world.publisher.fail = slow_publish
        dispatcher = Dispatcher(
            world.backend,
            world.publisher,
            world.dead,
            source=world.source,
            checkpoints=world.checkpoints,
            ownership=ownership,
            config=config,
        )
        thread = threading.Thread(target=dispatcher.run, daemon=True)
    else:
        dispatcher = AsyncDispatcher(
            AsyncMemoryBackend(world.backend),
            SlowPublisher(world.publisher),
            in_thread(world.dead),
            source=in_thread(world.source),
            checkpoints=in_thread(world.checkpoints),
            ownership=ownership,
            config=config,
        )
        run = dispatcher.run
        thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    assert dispatcher.started.wait(10)
    return dispatcher, thread


@pytest.mark.parametrize("start_from", ["resumed", "fresh", "acquired"])
def test_the_checkpoint_passes_every_mark_while_producers_keep_committing(
    world: World, driver: str, start_from: str
) -> None:
    """Resumed from a checkpoint; a fresh start behind a gate; partitions acquired with a
    large backlog, swept while the stream resumes from "now"."""
    ownership = Acquiring()
    if start_from == "resumed":
        world.checkpoints.resume_at(0)
    elif start_from == "fresh":
        world.backlog(50)
    else:
        world.backlog(2000)
        world.checkpoints.resume_at(len(world.backend.changes))
        ownership.acquired.append(None)
    traffic = HotTraffic(world.write, hot=HOT).start(threads=2, pause=0.001)
    dispatcher, thread = start(world, driver, ownership)
    try:
        for round_ in range(3):
            traffic.wait_commands(traffic.commands + 20)
            mark, started = len(world.backend.changes), time.monotonic()
            while world.checkpoints.saved() < mark:
                assert not traffic.errors, traffic.errors
                waited = time.monotonic() - started
                assert waited < BOUND, (
                    f"round {round_}: the checkpoint stayed at {world.checkpoints.saved()} "
                    f"behind mark {mark} for {waited:.1f} s while producers kept committing"
                )
                time.sleep(0.01)
    finally:
        traffic.stop()
        dispatcher.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert world.checkpoints.violations == []
    aged = {e.id for e in world.publisher.published if str(e.aggregate_id).startswith("aged")}
    assert start_from != "acquired" or aged  # the sweep ran
