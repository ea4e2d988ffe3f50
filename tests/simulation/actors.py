"""The simulated processes' shared parts, and the producer and consumer workers.

Each process is a generator that yields operations and receives their results, like the
library's own flows, which it runs with ``yield from`` (:meth:`Core.handle` here; the
dispatcher, the library's own dispatch engine, is driven by
:mod:`tests.simulation.dispatcher`). The simulator performs every
operation, so it can interleave processes, inject a fault at any step and kill a process
between any two steps.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, Field

from docoutbox.codec import decode_entry
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.loop import EngineOp
from docoutbox.errors import StoreError
from docoutbox.handlers import Decision, Handlers
from docoutbox.model import Aggregate, InboxPolicy, Message, cancel, emit
from docoutbox.ports.store import StoreBackend
from docoutbox.retry import RetryPolicy
from docoutbox.store.batch import BatchCore, Failed, Item
from docoutbox.store.core import Core, Op, Status, StoreConfig
from docoutbox.stored.claim import ClaimCheck, DeleteStale, FindStale
from docoutbox.stored.sweep import DeadLettered, sweep_flow
from tests.simulation.schedule import CLAIM_GRACE, CLAIM_THRESHOLD, CODEC, Schedule

M = TypeVar("M", bound=BaseModel)

#: The simulated clock's zero (as the world's).
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
COMMANDS = "commands"
DELIVERIES = "deliveries"


class Producer(Aggregate):
    """Applies ``Work`` commands; each emits one ``Effect`` per target consumer."""

    aggregate_type: ClassVar[str] = "Producer"
    applied: list[str] = Field(default_factory=list)


class Sink(Aggregate):
    """Records every ``Effect`` it processes: one entry per processing."""

    aggregate_type: ClassVar[str] = "Sink"
    seen: list[str] = Field(default_factory=list)


producer_handlers: Handlers[Producer] = Handlers()
sink_handlers: Handlers[Sink] = Handlers()


@producer_handlers.on("Work")
def work(state: Producer, message: Message) -> Decision[Producer]:
    """One ``Effect`` per target; scheduled ``after`` ms later, keyed ``{key}/{k}``, when
    the command says so."""
    targets = message.payload["targets"]
    assert isinstance(targets, list)
    after, key = message.payload.get("after"), message.payload.get("key")
    assert after is None or isinstance(after, int)
    assert key is None or isinstance(key, str)
    new = state.model_copy(update={"applied": [*state.applied, message.id]})
    effects = [
        emit(
            "Effect",
            _effect(message.id, k, k + (message.seq or 0)),
            destination=str(target),
            deliver_after=None if after is None else timedelta(milliseconds=after),
            key=None if key is None else f"{key}/{k}",
        )
        for k, target in enumerate(targets)
    ]
    return Decision(new, effects)


def _effect(command: str, k: int, n: int) -> dict[str, Any]:
    """An effect's payload: every other one (by ``n``) carries 128 hexadecimal digits,
    over the claim check's threshold whether compressed or not; the others stay under it
    (:data:`~tests.simulation.schedule.CLAIM_THRESHOLD`)."""
    payload: dict[str, Any] = {"command": command, "k": k}
    if n % 2 == 1:
        payload["pad"] = "".join(
            hashlib.sha256(f"{command}/{i}".encode()).hexdigest() for i in (0, 1)
        )
    return payload


@producer_handlers.on("Cancel")
def cancel_work(state: Producer, message: Message) -> Decision[Producer]:
    """Cancel the scheduled effects of an earlier command (those still pending)."""
    keys = message.payload["keys"]
    assert isinstance(keys, list)
    new = state.model_copy(update={"applied": [*state.applied, message.id]})
    return Decision(new, [cancel(str(key)) for key in keys])


@sink_handlers.on("Effect")
def effect(state: Sink, message: Message) -> Sink:
    return state.model_copy(update={"seen": [*state.seen, message.id]})


@dataclass(frozen=True)
class Command:
    aggregate_id: str
    message: Message
    targets: tuple[str, ...]


# Operations of the simulated environment, next to the library's own.
@dataclass(frozen=True)
class Receive:
    """Wait for a delivery from a queue."""

    queue: str


@dataclass(frozen=True)
class Poll:
    """Take a delivery from a queue if one is visible now; None otherwise (no waiting)."""

    queue: str


@dataclass(frozen=True)
class HandlerFault:
    """Ask the world whether a handler fails this time (the ``handler_error`` fault)."""


@dataclass(frozen=True)
class Ack:
    queue: str
    tag: int


@dataclass(frozen=True)
class Nack:
    queue: str
    tag: int


@dataclass(frozen=True)
class Idle:
    """Nothing to do for now: wait a few steps."""


SimOp = (
    Op
    | EngineOp
    | Receive
    | Poll
    | HandlerFault
    | Ack
    | Nack
    | Idle
    | FindStale
    | DeadLettered
    | DeleteStale
)
Process = Generator[SimOp, Any, None]
Step = Generator[SimOp, Any, Any]


@dataclass
class Env:
    """What every process of one schedule shares: its configuration and the stores."""

    schedule: Schedule
    producers: StoreBackend
    sinks: StoreBackend
    clock: Callable[[], datetime]
    stats: Counter[str]
    #: Stores shared by the workers of one process (``schedule.shared_store``), by side.
    shared: dict[str, Any] = field(default_factory=dict)
    #: The running dispatcher's published entries whose deferred trim is not written yet,
    #: and whether an aggregate has some.
    untrimmed: Callable[[], int] = lambda: 0
    trim_deferred: Callable[[Any], bool] = lambda aggregate_id: False
    #: Report a violation seen while running (the world's).
    violation: Callable[[str, str], None] = lambda invariant, detail: None
    #: The claim check's payload store (claim-checked schedules; the world's).
    payloads: Any = None

    def timer(self) -> float:
        """Seconds on the simulated clock."""
        return (self.clock() - EPOCH).total_seconds()

    def core(
        self, model: type[M], backend: StoreBackend, inbox: InboxPolicy, rng: random.Random
    ) -> Core[M]:
        retry = RetryPolicy(self.schedule.store_attempts, base_delay=0.002, max_delay=0.02)
        config = StoreConfig(
            inbox=inbox,
            retry=retry,
            deterministic_ids=self.schedule.deterministic_ids,
            clock=self.clock,
            rng=rng,
            codec=CODEC if self.schedule.encoded else None,
        )
        if self.schedule.claimed and model is Producer:
            claim = ClaimCheck(
                self.payloads, threshold=CLAIM_THRESHOLD, grace=CLAIM_GRACE, refresh=0.25
            )
            config = replace(config, claim_check=claim, timer=self.timer)
        return Core(model, config, backend.document_size, backend.max_document_bytes)

    def producer_inbox(self) -> InboxPolicy:
        if self.schedule.producer_exact:
            return InboxPolicy(window=0, exact=True)
        # Every command, no more: a client sends at most one cancel per command.
        return InboxPolicy(window=self.schedule.commands * 2)

    def sink_inbox(self) -> InboxPolicy:
        s = self.schedule
        if s.consumer_exact:
            return InboxPolicy(window=0, exact=True)
        if s.consumer_spill:
            return InboxPolicy(window=2 if s.consumer_window < 1 else s.consumer_window, spill=True)
        bound = s.producers * s.commands * s.max_targets  # the most one sink can receive
        return InboxPolicy(window=bound if s.consumer_window < 0 else s.consumer_window)

    @property
    def dispatch_policy(self) -> DispatchPolicy:
        return DispatchPolicy(self.schedule.publish_attempts, base_delay=0.002, max_delay=0.02)

    def worker_core(
        self, side: str, model: type[M], backend: StoreBackend, inbox: InboxPolicy, rng: Any
    ) -> Core[M]:
        """A worker's store: its own, or its process's when workers are threads of one."""
        if not self.schedule.shared_store:
            return self.core(model, backend, inbox, rng)
        if side not in self.shared:
            self.shared[side] = self.core(model, backend, inbox, rng)
        core: Core[M] = self.shared[side]
        return core


def producer(env: Env, rng: random.Random) -> Process:
    """Handle commands on producer aggregates; acknowledge only after the commit."""
    core = env.worker_core("producers", Producer, env.producers, env.producer_inbox(), rng)
    while True:
        delivery = yield Receive(COMMANDS)
        command: Command = delivery.body
        try:
            flow = core.handle(
                command.aggregate_id, command.message, producer_handlers, create=True
            )
            outcome = yield from flow
        except StoreError:
            env.stats["producer.store_error"] += 1
            yield Nack(COMMANDS, delivery.tag)
            continue
        env.stats[f"producer.{outcome.status}"] += 1
        settle = Nack if outcome.status is Status.GAVE_UP else Ack
        yield settle(COMMANDS, delivery.tag)


def consumer(env: Env, rng: random.Random) -> Process:
    """Handle broker deliveries on sink aggregates; acknowledge only after the commit."""
    core = env.worker_core("consumers", Sink, env.sinks, env.sink_inbox(), rng)
    if env.schedule.consumer_batch > 1:
        yield from batch_consumer(env, core)
    while True:
        delivery = yield Receive(DELIVERIES)
        entry = decode_entry(delivery.body)
        assert entry.destination is not None
        try:
            flow = core.handle(entry.destination, entry.to_message(), sink_handlers, create=True)
            outcome = yield from flow
        except StoreError:
            env.stats["consumer.store_error"] += 1
            yield Nack(DELIVERIES, delivery.tag)
            continue
        env.stats[f"consumer.{outcome.status}"] += 1
        settle = Nack if outcome.status is Status.GAVE_UP else Ack
        yield settle(DELIVERIES, delivery.tag)


def _failing(message_id: str) -> Callable[[Sink, Message], Sink]:
    def fail(state: Sink, message: Message) -> Sink:
        raise RuntimeError(f"injected: the handler of {message_id} fails this time")

    return fail


def batch_consumer(env: Env, core: Core[Sink]) -> Process:
    """Take up to ``consumer_batch`` visible deliveries, handle each destination's share
    with one ``handle_batch``, then acknowledge per message: a message whose handler
    failed (``handler_error``) or whose batch could not commit is nacked and redelivered."""
    batcher = BatchCore(core, env.sinks.document_size, env.sinks.max_document_bytes)
    while True:
        deliveries = [(yield Receive(DELIVERIES))]
        while len(deliveries) < env.schedule.consumer_batch:
            more = yield Poll(DELIVERIES)
            if more is None:
                break
            deliveries.append(more)
        groups: dict[str, list[Any]] = {}
        for delivery in deliveries:
            entry = decode_entry(delivery.body)
            assert entry.destination is not None
            groups.setdefault(entry.destination, []).append((delivery, entry))
        for destination, group in groups.items():
            items = []
            for _, entry in group:
                message = entry.to_message()
                broken = yield HandlerFault()
                handler = _failing(message.id) if broken else sink_handlers
                items.append(Item(message, handler, create=True))
            env.stats[f"consumer.batch_size.{min(len(items), 4)}"] += 1
            try:
                result = yield from batcher.handle_batch(destination, items)
            except StoreError:
                env.stats["consumer.store_error"] += 1
                for delivery, _ in group:
                    yield Nack(DELIVERIES, delivery.tag)
                continue
            for (delivery, _), outcome in zip(group, result.results, strict=True):
                if isinstance(outcome, Failed):
                    env.stats["consumer.batch_failed"] += 1
                    yield Nack(DELIVERIES, delivery.tag)
                    continue
                env.stats[f"consumer.{outcome.status}"] += 1
                settle = Nack if outcome.status is Status.GAVE_UP else Ack
                yield settle(DELIVERIES, delivery.tag)


def sweeper(env: Env, rng: random.Random) -> Process:
    """The orphan sweep of the claim check's payload store, now and then
    (:func:`~docoutbox.stored.sweep.sweep_flow`, the library's own)."""
    while True:
        yield Idle()
        try:
            report = yield from sweep_flow(env.clock(), CLAIM_GRACE, rng.randint(1, 4))
        except StoreError:
            env.stats["sweeper.store_error"] += 1
            continue
        env.stats["sweeper.deleted"] += len(report.deleted)
        env.stats["sweeper.referenced"] += len(report.referenced)
        env.stats["sweeper.refreshed"] += len(report.refreshed)
