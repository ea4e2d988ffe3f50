"""The composition root builds the dispatcher the CLI runs: leases, lease-table partitions,
the leased stream of a table that keeps positions, and refusals of what it cannot use."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from docoutbox import AsyncDispatcher, Dispatcher
from docoutbox.dispatch.drivers.aio import InThread
from docoutbox.dispatch.drivers.ownership import LeaseKeeper, SoleOwner
from docoutbox.errors import InvalidConfig
from docoutbox.store.document import Document
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints, MemoryLeaseTable
from docoutbox_app import DispatchOptions, build_async_dispatcher, build_dispatcher
from docoutbox_app.cli import _options


@dataclass
class Kit:
    backend: MemoryBackend = field(default_factory=MemoryBackend)
    source: Any = None
    checkpoints: MemoryCheckpoints = field(default_factory=MemoryCheckpoints)
    leases: Any = field(default_factory=MemoryLeaseTable)
    dead_letters: MemoryDeadLetters = field(default_factory=MemoryDeadLetters)

    def __post_init__(self) -> None:
        self.source = self.source or MemoryChangeSource(self.backend)

    def close(self) -> None:
        return None


class RangeLeases(MemoryLeaseTable):
    """A lease table with partitions of its own, that keeps stream positions."""

    def __init__(self, leased: tuple[Any, Any]) -> None:
        super().__init__()
        self.leased = leased

    @property
    def partitions(self) -> int:
        return 3

    def locate(self, document: Document) -> int:
        return 0

    def leased_ports(self) -> tuple[Any, Any]:
        return self.leased


def test_without_leases_a_single_instance_owns_everything() -> None:
    dispatcher = build_dispatcher(Kit(), MemoryPublisher(), DispatchOptions(leases=False))
    assert isinstance(dispatcher, Dispatcher)
    assert isinstance(dispatcher.ownership, SoleOwner)


def test_with_leases_the_keeper_shares_the_configured_partitions() -> None:
    options = DispatchOptions(name="orders", partitions=7, lease_ttl=4.0)
    dispatcher = build_dispatcher(Kit(), MemoryPublisher(), options)
    keeper = dispatcher.ownership
    assert isinstance(keeper, LeaseKeeper)
    assert keeper.partitions == 7
    assert keeper.timing.ttl == 4.0
    assert keeper.owner.startswith("orders@")


def test_a_table_with_partitions_and_positions_of_its_own_is_followed() -> None:
    leased = (MemoryChangeSource(MemoryBackend()), MemoryCheckpoints())
    kit = Kit(leases=RangeLeases(leased))
    dispatcher = build_dispatcher(kit, MemoryPublisher(), DispatchOptions(partitions=16))
    assert isinstance(dispatcher.ownership, LeaseKeeper)
    assert dispatcher.ownership.partitions == 3
    assert dispatcher.source is leased[0]
    assert dispatcher.checkpoints is leased[1]
    alone = build_dispatcher(kit, MemoryPublisher(), DispatchOptions(leases=False))
    assert alone.source is kit.source
    assert alone.checkpoints is kit.checkpoints


def test_polling_mode_has_no_stream_and_no_grace() -> None:
    options = DispatchOptions(poll_interval=2.5, grace=30.0)
    dispatcher = build_dispatcher(Kit(), MemoryPublisher(), options)
    assert dispatcher.source is None
    assert dispatcher.config.sweep_interval == 2.5
    assert dispatcher.config.grace == 0.0


def test_the_stream_waits_are_the_options_and_do_not_grow_by_default() -> None:
    assert build_dispatcher(Kit(), MemoryPublisher()).config.max_stream_wait is None
    options = DispatchOptions(max_stream_wait=2.0)
    assert build_dispatcher(Kit(), MemoryPublisher(), options).config.max_stream_wait == 2.0


@pytest.mark.parametrize("kit", [None, object(), "mongodb://localhost"])
def test_what_is_not_a_kit_is_refused(kit: Any) -> None:
    with pytest.raises(InvalidConfig, match="needs a StoreKit"):
        build_dispatcher(kit, MemoryPublisher())
    with pytest.raises(InvalidConfig, match="needs an AsyncStoreKit"):
        build_async_dispatcher(kit, MemoryPublisher())


def test_the_async_root_runs_a_sync_publisher_in_threads() -> None:
    @dataclass
    class AsyncKit:
        backend: Any = field(default_factory=lambda: InThread(MemoryBackend()))
        source: Any = None
        checkpoints: Any = field(default_factory=lambda: InThread(MemoryCheckpoints()))
        leases: Any = field(default_factory=MemoryLeaseTable)
        dead_letters: Any = field(default_factory=lambda: InThread(MemoryDeadLetters()))

        async def close(self) -> None:
            return None

    publisher = MemoryPublisher()
    dispatcher = build_async_dispatcher(AsyncKit(), publisher, DispatchOptions(leases=False))
    assert isinstance(dispatcher, AsyncDispatcher)
    sent: Callable[..., Any] = dispatcher.ports.publisher.publish
    assert asyncio.iscoroutinefunction(sent)


def test_the_command_s_options_are_the_root_s() -> None:
    args = argparse.Namespace(
        no_leases=True,
        lease_ttl=3.0,
        partitions=5,
        concurrency=4,
        run_batch=2,
        max_attempts=9,
        sweep_interval=11.0,
        grace=1.5,
        poll_interval=None,
        max_stream_wait=2.0,
        checkpoint_interval=0.5,
        due_interval=0.25,
        decode=None,
        trim_delay=0.25,
        max_untrimmed=40,
        claim_check=True,
        publish_references=True,
    )
    assert _options(args, "n") == DispatchOptions(
        name="n",
        leases=False,
        lease_ttl=3.0,
        partitions=5,
        concurrency=4,
        run_batch=2,
        max_attempts=9,
        sweep_interval=11.0,
        grace=1.5,
        poll_interval=None,
        max_stream_wait=2.0,
        checkpoint_interval=0.5,
        due_interval=0.25,
        trim_delay=0.25,
        max_untrimmed=40,
        claim_check=True,
        publish_references=True,
    )
    config = _options(args, "n").config()
    assert (config.trim_delay, config.max_untrimmed) == (0.25, 40)
    assert config.due_interval == 0.25
    assert config.publish_references
