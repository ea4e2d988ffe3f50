"""Each feed range is a lane of the Cosmos change feed: its events say so, and the source
merges the positions of lanes held back (see ``tests/unit/test_lanes.py``), so a slow range
no longer holds back the continuations of the others."""

from __future__ import annotations

from typing import Any

from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.engine.checkpoint import LanedTracker
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource
from tests.support import loopless
from tests.unit.test_cosmos_feed_memory import POSITION, RANGE, AsyncPager, Container, Pager

KEY = next(iter(POSITION["ranges"]))


def test_a_pages_events_carry_its_feed_range_as_their_lane() -> None:
    source = CosmosChangeSource(Container(Pager), feed_ranges=[RANGE])
    source.open(POSITION)
    events = source.poll(10)
    assert [e.lane for e in events] == [KEY] * 3
    assert [e.position["ranges"][KEY] for e in events] == ["t0", "t0", "next"]


def test_the_async_sources_events_do_too() -> None:
    source = AsyncCosmosChangeSource(Container(AsyncPager), feed_ranges=[RANGE])

    async def poll() -> list[Any]:
        await source.open(POSITION)
        return await source.poll(10)

    assert [e.lane for e in loopless.run(poll())] == [KEY] * 3


def test_merging_takes_each_held_ranges_continuation_and_holding_from_its_own_position() -> None:
    merge = CosmosChangeSource.merge_positions
    latest = {"v": 1, "ranges": {"a": "a9", "b": "b9", "c": "c9"}, "holdings": {"a": 2, "b": 2}}
    held = {
        "a": {"v": 1, "ranges": {"a": "a3", "b": "b1"}, "holdings": {"a": 1}},
        "c": {"v": 1, "ranges": {"a": "a1"}},  # read before range c joined: c is left out
    }
    assert merge(latest, held) == {
        "v": 1,
        "ranges": {"a": "a3", "b": "b9"},
        "holdings": {"a": 1, "b": 2},
    }
    assert latest["ranges"] == {"a": "a9", "b": "b9", "c": "c9"}  # not changed
    assert merge(latest, {}) == latest


def test_a_dispatcher_on_a_cosmos_source_tracks_lanes() -> None:
    backend = MemoryBackend()
    dispatcher = Dispatcher(
        backend,
        MemoryPublisher(),
        MemoryDeadLetters(),
        source=CosmosChangeSource(Container(Pager), feed_ranges=[RANGE]),
    )
    assert isinstance(dispatcher.engine.tracker, LanedTracker)
