"""The composition root: a ready dispatcher from a kit, a publisher and options.

Rule: this is the one place that assembles a dispatcher from its parts (store backend,
change source, checkpoints, leases, dead letters, publisher). ``docoutbox dispatch`` and
``docoutbox run`` call exactly these functions; so can a Python program::

    from docoutbox_app import DispatchOptions, build_dispatcher
    from docoutbox_mongo import open_kit

    kit = open_kit("mongodb://localhost", "shop", "orders")
    dispatcher = build_dispatcher(kit, publisher, DispatchOptions(name="orders"))
    dispatcher.run()  # until dispatcher.stop(); then kit.close()

With leases (the default), several instances share the collection's partitions; a lease
table that carries stream positions itself (Cosmos DB feed ranges) also gives the change
source and checkpoints that follow the held leases.
"""

from __future__ import annotations

import inspect
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any, cast

from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.ownership import LeaseKeeper, SoleOwner
from docoutbox.dispatch.drivers.threads import Dispatcher
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.dispatch.engine.metrics import Metrics
from docoutbox.errors import InvalidConfig
from docoutbox.ports.dispatch import (
    AsyncChangeSource,
    AsyncCheckpoints,
    AsyncPublisher,
    ChangeSource,
    Checkpoints,
    LeaseTable,
    LocatedLeases,
    Ownership,
    Publisher,
    StreamLeases,
)
from docoutbox.ports.kit import AsyncStoreKit, StoreKit
from docoutbox.ports.payloads import AsyncPayloadKit, PayloadKit
from docoutbox.stored import Codec, Upcasters


@dataclass(frozen=True)
class DispatchOptions:
    """How a dispatcher runs (the ``docoutbox dispatch`` options, by the same names).

    - ``name``: its checkpoint's name, and the prefix of its lease owner;
    - ``leases``: share the partitions with other instances (False: a single instance);
      ``lease_ttl``: seconds, the fail-over time; ``partitions``: the stores'
      ``StoreConfig.partitions`` (a lease table with partitions of its own overrides it);
    - ``poll_interval``: without a change stream, sweep every this many seconds;
    - ``max_stream_wait``: while reads of the change stream bring nothing, space them out
      up to this many seconds (:attr:`DispatcherConfig.max_stream_wait`; None: read every
      0.05 s, except in an endpoint, whose own commits wake its dispatcher: there up to
      :data:`~docoutbox_app.endpoint.runtime.STREAM_WAIT`);
    - ``codec``, ``upcasters``: the stores' (:mod:`docoutbox.stored`), to publish their
      entries decoded and current;
    - ``due_interval``: query for scheduled entries fallen due every this many seconds
      (part of their lateness bound, see the scheduling guide);
    - ``trim_delay``, ``max_untrimmed``: trims written behind the publishes, within this
      many seconds, with at most this many published entries waiting for their trim
      (``trim_delay=0``: each run trims before it ends);
    - ``claim_check``: resolve claim-checked entries from the kit's payload store
      (:class:`~docoutbox.ports.payloads.PayloadKit`), and delete their payloads after
      the trim; ``publish_references``: publish their reference envelopes instead;
    - the rest as :class:`~docoutbox.dispatch.engine.loop.DispatcherConfig`.
    """

    name: str = "dispatch"
    leases: bool = True
    lease_ttl: float = 10.0
    partitions: int = 16
    concurrency: int = 32
    run_batch: int = 16
    max_attempts: int = 5
    sweep_interval: float = 60.0
    grace: float = 30.0
    poll_interval: float | None = None
    max_stream_wait: float | None = None
    checkpoint_interval: float = 1.0
    due_interval: float = 0.5
    codec: Codec | None = None
    upcasters: Upcasters | None = None
    trim_delay: float = 0.002
    max_untrimmed: int = 2_000
    claim_check: bool = False
    publish_references: bool = False

    def config(self) -> DispatcherConfig:
        polling = self.poll_interval is not None
        sweep = self.poll_interval if self.poll_interval is not None else self.sweep_interval
        return DispatcherConfig(
            name=self.name,
            partitions=self.partitions,
            concurrency=self.concurrency,
            run_batch=self.run_batch,
            policy=DispatchPolicy(max_attempts=self.max_attempts),
            sweep_interval=sweep,
            grace=0.0 if polling else self.grace,
            checkpoint_interval=self.checkpoint_interval,
            due_interval=self.due_interval,
            max_stream_wait=self.max_stream_wait,
            codec=self.codec,
            upcasters=self.upcasters,
            trim_delay=self.trim_delay,
            max_untrimmed=self.max_untrimmed,
            publish_references=self.publish_references,
        )


def owner_name(name: str) -> str:
    """A lease owner unique to this process: the dispatcher's name, host, pid, a nonce."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def ownership(leases: LeaseTable, options: DispatchOptions) -> Ownership:
    """A :class:`LeaseKeeper` over ``leases`` (or a sole owner without leases)."""
    if not options.leases:
        return SoleOwner()
    partitions = leases.partitions if isinstance(leases, LocatedLeases) else options.partitions
    return LeaseKeeper(
        leases,
        partitions=partitions,
        owner=owner_name(options.name),
        timing=LeaseTiming(ttl=options.lease_ttl),
    )


def kit_payloads(kit: object, options: DispatchOptions) -> Any:
    """The kit's payload store when ``options.claim_check`` (None otherwise); checked
    once: :class:`InvalidConfig` for a kit without one."""
    if not options.claim_check:
        return None
    if not isinstance(kit, PayloadKit | AsyncPayloadKit):
        raise InvalidConfig(
            f"claim_check needs a kit with a payload store, got {type(kit).__name__}"
        )
    return kit.payloads


def build_dispatcher(
    kit: StoreKit,
    publisher: Publisher,
    options: DispatchOptions | None = None,
    *,
    metrics: Metrics | None = None,
) -> Dispatcher:
    """A threaded :class:`~docoutbox.Dispatcher` on ``kit``, publishing to ``publisher``.

    Raises :class:`~docoutbox.errors.InvalidConfig` for a kit or options it cannot use.
    """
    options = options or DispatchOptions()
    if not isinstance(kit, StoreKit):
        raise InvalidConfig(f"build_dispatcher needs a StoreKit, got {type(kit).__name__}")
    source: ChangeSource = kit.source
    checkpoints: Checkpoints = kit.checkpoints
    if options.leases and isinstance(kit.leases, StreamLeases):
        source, checkpoints = kit.leases.leased_ports()
    return Dispatcher(
        kit.backend,
        publisher,
        kit.dead_letters,
        source=None if options.poll_interval is not None else source,
        checkpoints=checkpoints,
        ownership=ownership(kit.leases, options),
        config=options.config(),
        metrics=metrics,
        payloads=kit_payloads(kit, options),
    )


def build_async_dispatcher(
    kit: AsyncStoreKit,
    publisher: AsyncPublisher | Publisher,
    options: DispatchOptions | None = None,
    *,
    metrics: Metrics | None = None,
) -> AsyncDispatcher:
    """An :class:`~docoutbox.AsyncDispatcher` on ``kit``; a sync ``publisher`` publishes
    in worker threads."""
    options = options or DispatchOptions()
    if not isinstance(kit, AsyncStoreKit):
        raise InvalidConfig(
            f"build_async_dispatcher needs an AsyncStoreKit, got {type(kit).__name__}"
        )
    source: AsyncChangeSource = kit.source
    checkpoints: AsyncCheckpoints = kit.checkpoints
    if options.leases and isinstance(kit.leases, StreamLeases):
        # The lease table is sync (its keeper heartbeats on a thread of its own): so are
        # the feed and the positions it keeps.
        leased_source, leased_checkpoints = kit.leases.leased_ports()
        source, checkpoints = in_thread(leased_source), in_thread(leased_checkpoints)
    sender = cast(
        AsyncPublisher,
        publisher if inspect.iscoroutinefunction(publisher.publish) else in_thread(publisher),
    )
    return AsyncDispatcher(
        kit.backend,
        sender,
        kit.dead_letters,
        source=None if options.poll_interval is not None else source,
        checkpoints=checkpoints,
        ownership=ownership(kit.leases, options),
        config=options.config(),
        metrics=metrics,
        payloads=kit_payloads(kit, options),
    )
