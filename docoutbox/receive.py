"""How received entries are settled: ack after commit, requeue, or reject. No broker I/O.

Rule: a delivery is acknowledged only once its message is committed to the store (or
recognized as a duplicate), or kept in the dead letters after its retries; per aggregate,
no message is applied after an earlier one of the same poll that is not yet settled.

Broker-neutral and sans-IO: :func:`receive_flow` decodes a poll's deliveries, handles them
per aggregate (one ``handle_batch`` write for several, ``handle`` for one), retries failed
handlers (:class:`HandlerRetry`), asks for rejected deliveries to be kept, and returns one
:class:`Verdict` per delivery. :class:`Receiver` and :class:`AsyncReceiver` drive it over a
sync or async store; consumer helpers map each verdict to their broker's ack,
nack-with-requeue or reject, or to offsets.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
import time
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from docoutbox.codec import decode_message
from docoutbox.drive import drive, drive_async
from docoutbox.errors import (
    ConcurrencyConflict,
    DocOutboxError,
    DocumentTooLarge,
    InboxSaturated,
    InvalidConfig,
    InvalidInput,
    NotFound,
    PermanentStoreError,
    TransientStoreError,
)
from docoutbox.handlers import Context, Decision, Handler, takes_context
from docoutbox.model import AggregateId, Message
from docoutbox.retry import backoff
from docoutbox.store.api import AggregateStore, AsyncAggregateStore
from docoutbox.store.batch import BatchOutcome, Failed
from docoutbox.store.core import Outcome, Sleep, Status

S = TypeVar("S", bound=BaseModel)


class Action(StrEnum):
    ACK = "ack"  # committed (applied) or already in the inbox (duplicate)
    REQUEUE = "requeue"  # worth another try: nack with requeue
    REJECT = "reject"  # never acceptable: reject without requeue (dead-letter exchange)


@dataclass(frozen=True)
class Verdict:
    """What to do with one delivery, and why."""

    action: Action
    message: Message | None = None
    outcome: Outcome[Any] | None = None
    error: BaseException | None = None
    #: Stop consuming after settling: the store failed in a way retrying will not fix.
    fatal: bool = False
    #: How many times the delivery was handled before this verdict (handler retries).
    attempts: int = 1
    #: A rejected delivery was kept in the dead letters (True), or keeping it failed and
    #: it is requeued instead (False); None when there was nothing to keep.
    kept: bool | None = None
    #: Why keeping a rejected delivery failed.
    keep_error: BaseException | None = None


#: Errors that make a delivery unacceptable as it is: requeueing would loop forever.
REJECT_ERRORS: tuple[type[Exception], ...] = (InvalidInput, DocumentTooLarge, NotFound)
#: Errors that may pass when the delivery comes again.
REQUEUE_ERRORS: tuple[type[Exception], ...] = (
    TransientStoreError,
    ConcurrencyConflict,
    InboxSaturated,
)
#: Rejections that no retry can fix: the delivery itself is wrong.
FINAL_ERRORS: tuple[type[Exception], ...] = (InvalidInput, DocumentTooLarge)


def judge(message: Message, outcome: Outcome[Any]) -> Verdict:
    """The verdict for a handled message: ack unless the store gave up."""
    if outcome.status is Status.GAVE_UP:
        return Verdict(Action.REQUEUE, message, outcome)
    return Verdict(Action.ACK, message, outcome)


def judge_error(message: Message | None, exc: Exception) -> Verdict:
    """The verdict for a delivery whose decoding or handling raised ``exc``."""
    if isinstance(exc, REJECT_ERRORS):
        return Verdict(Action.REJECT, message, error=exc)
    if isinstance(exc, REQUEUE_ERRORS):
        return Verdict(Action.REQUEUE, message, error=exc)
    if isinstance(exc, PermanentStoreError):
        return Verdict(Action.REQUEUE, message, error=exc, fatal=True)
    # Anything else is a handler bug: dead-letter it rather than loop on it.
    return Verdict(Action.REJECT, message, error=exc)


def describe(verdict: Verdict) -> str:
    """Which message, and why it was not acked (for logs)."""
    name = f"message {verdict.message.id}" if verdict.message is not None else "a delivery"
    if verdict.keep_error is not None:
        error = verdict.keep_error
        return f"{name}: its dead letter could not be kept: {type(error).__name__}: {error}"
    if verdict.error is not None:
        return f"{name}: {type(verdict.error).__name__}: {verdict.error}"
    assert verdict.outcome is not None
    return f"{name}: gave up after {verdict.outcome.attempts} attempts"


@dataclass(frozen=True)
class HandlerRetry:
    """Retries of a delivery whose handling failed, before it is rejected: ``immediate``
    attempts at once, then ``delayed`` attempts after exponential backoff with jitter
    (:func:`docoutbox.retry.backoff`). Invalid input is never retried."""

    immediate: int = 2
    delayed: int = 3
    base_delay: float = 0.2
    max_delay: float = 5.0

    def delays(self, rng: random.Random) -> list[float]:
        later = [
            backoff(n, self.base_delay, self.max_delay, rng, floor=0.5)
            for n in range(1, self.delayed + 1)
        ]
        return [0.0] * self.immediate + later


#: No handler retries: a failing delivery is rejected at once.
NO_RETRY = HandlerRetry(immediate=0, delayed=0)


def retryable(verdict: Verdict) -> bool:
    return verdict.action is Action.REJECT and not isinstance(verdict.error, FINAL_ERRORS)


# --- the flow's operations -------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One received body, with the headers and content type a CloudEvent may need."""

    body: bytes
    headers: Mapping[str, Any] | None = None
    content_type: str | None = None


@dataclass(frozen=True)
class Handle:
    """``store.handle(aggregate_id, message, handler, create=create)``; sends the Outcome."""

    aggregate_id: AggregateId
    message: Message
    handler: Handler[Any]
    create: bool


@dataclass(frozen=True)
class HandleBatch:
    """``store.handle_batch(aggregate_id, messages, handler, create=create)``."""

    aggregate_id: AggregateId
    messages: tuple[Message, ...]
    handler: Handler[Any]
    create: bool


@dataclass(frozen=True)
class Keep:
    """Keep the rejected delivery ``index`` in the dead letters; raise if that failed."""

    index: int
    verdict: Verdict


class Deferred(DocOutboxError):
    """A message of a batch left out because an earlier one of its aggregate failed."""


@dataclass(frozen=True)
class Options:
    """What :func:`receive_flow` does besides handling: batches, retries, dead letters."""

    #: Every message may create its aggregate (``handle(create=True)``).
    create: bool = False
    retry: HandlerRetry = field(default_factory=HandlerRetry)
    #: Handle several messages of one aggregate in one ``handle_batch`` write.
    batch: bool = True
    #: Ask for rejected deliveries to be kept (:class:`Keep`).
    keep: bool = False
    #: The message types that may create their aggregate when it does not exist yet; a
    #: message of another type to a missing aggregate is NotFound (retried, then
    #: rejected). Any iterable of str, kept as a frozenset.
    creates: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "creates", creating_types(self.creates))

    def may_create(self, message: Message) -> bool:
        """Whether handling ``message`` may create its aggregate."""
        return self.create or message.type in self.creates


def creating_types(types: object) -> frozenset[str]:
    """``types`` (message types that may create an aggregate) as a frozenset; InvalidConfig
    for a bare string or anything but non-empty strings."""
    if isinstance(types, str | bytes) or not isinstance(types, Iterable):
        raise InvalidConfig(
            f"the types that may create are a collection of message types, got {types!r}"
        )
    found = frozenset(types)
    for name in found:
        if type(name) is not str or not name:
            raise InvalidConfig(f"a message type is a non-empty str, got {name!r}")
    return found


ReceiveOp = Handle | HandleBatch | Sleep | Keep
ReceiveFlow = Generator[ReceiveOp, Any, list[Verdict]]


def _guarded(handler: Handler[S], order: Mapping[str, int]) -> Handler[S]:
    """``handler``, raising :class:`Deferred` for messages after one that failed."""
    failed_at: list[int] = []

    contextual = takes_context(handler)

    def run(state: S, message: Message, context: Context) -> Decision[S] | S:
        position = order.get(message.id, 0)
        if failed_at and position > min(failed_at):
            raise Deferred(f"message {message.id} waits for an earlier one that failed")
        try:
            return handler(state, message, context) if contextual else handler(state, message)
        except Exception:
            failed_at.append(position)
            raise

    return run


def receive_flow(
    deliveries: Sequence[Delivery],
    handler: Handler[S],
    aggregate_id_of: Callable[[Message], AggregateId],
    options: Options,
    rng: random.Random,
) -> ReceiveFlow:
    """One verdict per delivery, in the order given (sans-IO; see the module's rule).

    Per aggregate, its messages are handled in order: several in one ``HandleBatch``
    (with ``options.batch``), one with ``Handle``. A failing handler is retried alone
    (``options.retry``) before the messages after it are handled; a message whose verdict
    is a requeue holds back the later messages of its aggregate (requeued too, unhandled).
    A rejected delivery is then kept (``Keep``, with ``options.keep``); if keeping fails,
    it is requeued instead.
    """
    verdicts: list[Verdict | None] = [None] * len(deliveries)
    groups: dict[AggregateId, list[tuple[int, Message]]] = {}
    for index, delivery in enumerate(deliveries):
        message: Message | None = None
        try:
            message = decode_message(delivery.body, delivery.headers, delivery.content_type)
            groups.setdefault(aggregate_id_of(message), []).append((index, message))
        except Exception as exc:  # noqa: BLE001 - every error becomes a verdict (judge_error)
            verdicts[index] = judge_error(message, exc)
    for aggregate_id, items in groups.items():
        pending = items
        while pending:
            results = yield from _handle(aggregate_id, pending, handler, options)
            done = 0
            # Messages without a verdict (deferred behind a failure, or not in this
            # handling) are handled again in the next round.
            for (index, message), verdict in zip(pending, results, strict=False):
                if verdict is None:
                    break
                if retryable(verdict):
                    verdict = yield from _retry(
                        aggregate_id, message, handler, options, rng, verdict
                    )
                verdicts[index] = verdict
                done += 1
                if verdict.action is Action.REQUEUE:
                    for later, other in pending[done:]:
                        verdicts[later] = replace(verdict, message=other, attempts=0)
                    done = len(pending)
                    break
            pending = pending[done:]
    final: list[Verdict] = []
    for index, verdict in enumerate(verdicts):
        assert verdict is not None
        if options.keep and verdict.action is Action.REJECT:
            try:
                yield Keep(index, verdict)
            except Exception as exc:  # noqa: BLE001 - requeued rather than lost
                verdict = replace(verdict, action=Action.REQUEUE, kept=False, keep_error=exc)
            else:
                verdict = replace(verdict, kept=True)
        final.append(verdict)
    return final


def _handle(
    aggregate_id: AggregateId,
    pending: Sequence[tuple[int, Message]],
    handler: Handler[S],
    options: Options,
) -> Generator[ReceiveOp, Any, list[Verdict | None]]:
    """Verdicts of the first of ``pending`` (all of them with ``options.batch``); None for a
    message deferred behind a failure."""
    messages = tuple(message for _, message in pending)
    if not options.may_create(messages[0]):
        # A message that may create its aggregate starts a batch of its own: one handled
        # after messages that may not must still be able to create it.
        for position, message in enumerate(messages[1:], 1):
            if options.may_create(message):
                messages = messages[:position]
                break
    if len(messages) == 1 or not options.batch:
        message = messages[0]
        try:
            outcome = yield Handle(aggregate_id, message, handler, options.may_create(message))
        except Exception as exc:  # noqa: BLE001 - every error becomes a verdict (judge_error)
            return [judge_error(message, exc)]
        return [judge(message, outcome)]
    order: dict[str, int] = {}
    for position, message in enumerate(messages):
        order.setdefault(message.id, position)
    guarded = _guarded(handler, order)
    try:
        batch: BatchOutcome[Any] = yield HandleBatch(
            aggregate_id, messages, guarded, options.may_create(messages[0])
        )
    except Exception as exc:  # noqa: BLE001 - every error becomes a verdict (judge_error)
        return [judge_error(message, exc) for message in messages]
    results: list[Verdict | None] = []
    for message, result in zip(messages, batch.results, strict=True):
        if isinstance(result, Failed):
            error = result.error
            results.append(None if isinstance(error, Deferred) else judge_error(message, error))
        else:
            results.append(judge(message, result))
    return results


def _retry(
    aggregate_id: AggregateId,
    message: Message,
    handler: Handler[S],
    options: Options,
    rng: random.Random,
    first: Verdict,
) -> Generator[ReceiveOp, Any, Verdict]:
    """Handle ``message`` again as ``options.retry`` says while it is a retryable reject."""
    verdict, attempts = first, 1
    for delay in options.retry.delays(rng):
        if not retryable(verdict):
            break
        if delay > 0:
            yield Sleep(delay)
        attempts += 1
        try:
            outcome = yield Handle(aggregate_id, message, handler, options.may_create(message))
        except Exception as exc:  # noqa: BLE001 - every error becomes a verdict (judge_error)
            verdict = judge_error(message, exc)
        else:
            verdict = judge(message, outcome)
    return replace(verdict, attempts=attempts)


# --- the drivers -----------------------------------------------------------------------


class _Base(Generic[S]):
    def __init__(
        self,
        handler: Handler[S],
        aggregate_id_of: Callable[[Message], AggregateId],
        options: Options,
        rng: random.Random | None,
    ) -> None:
        self.handler = handler
        self.aggregate_id_of = aggregate_id_of
        self.options = options
        self.rng = rng or random.Random()

    def flow(self, deliveries: Sequence[Delivery]) -> ReceiveFlow:
        return receive_flow(deliveries, self.handler, self.aggregate_id_of, self.options, self.rng)


class Receiver(_Base[S]):
    """Runs :func:`receive_flow` over a sync store. ``keep(index, verdict)`` keeps a
    rejected delivery (raising if it could not); ``sleep`` waits between retries."""

    def __init__(
        self,
        store: AggregateStore[S],
        handler: Handler[S],
        aggregate_id_of: Callable[[Message], AggregateId],
        options: Options,
        *,
        keep: Callable[[int, Verdict], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(handler, aggregate_id_of, options, rng)
        self.store = store
        self.keep = keep
        self.sleep = sleep

    def receive(
        self,
        deliveries: Sequence[Delivery],
        *,
        keep: Callable[[int, Verdict], None] | None = None,
    ) -> list[Verdict]:
        """One verdict per delivery; ``keep``, when given, keeps this call's rejected
        deliveries instead of the receiver's (a receiver built once, a ``keep`` that knows
        the call's raw bodies)."""
        return drive(self.flow(deliveries), partial(self._perform, keep or self.keep))

    def _perform(self, keep: Callable[[int, Verdict], None] | None, op: ReceiveOp) -> Any:
        if isinstance(op, Handle):
            return self.store.handle(op.aggregate_id, op.message, op.handler, create=op.create)
        if isinstance(op, HandleBatch):
            return self.store.handle_batch(
                op.aggregate_id, op.messages, op.handler, create=op.create
            )
        if isinstance(op, Sleep):
            return self.sleep(op.seconds)
        assert keep is not None, "Options.keep without a keep function"
        return keep(op.index, op.verdict)


class AsyncReceiver(_Base[S]):
    """The async twin of :class:`Receiver`, over an :class:`AsyncAggregateStore`."""

    def __init__(
        self,
        store: AsyncAggregateStore[S],
        handler: Handler[S],
        aggregate_id_of: Callable[[Message], AggregateId],
        options: Options,
        *,
        keep: Callable[[int, Verdict], Awaitable[None]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(handler, aggregate_id_of, options, rng)
        self.store = store
        self.keep = keep
        self.sleep = sleep

    async def receive(
        self,
        deliveries: Sequence[Delivery],
        *,
        keep: Callable[[int, Verdict], Awaitable[None]] | None = None,
    ) -> list[Verdict]:
        """As :meth:`Receiver.receive`."""
        return await drive_async(self.flow(deliveries), partial(self._perform, keep or self.keep))

    async def _perform(
        self, keep: Callable[[int, Verdict], Awaitable[None]] | None, op: ReceiveOp
    ) -> Any:
        if isinstance(op, Handle):
            return await self.store.handle(
                op.aggregate_id, op.message, op.handler, create=op.create
            )
        if isinstance(op, HandleBatch):
            return await self.store.handle_batch(
                op.aggregate_id, op.messages, op.handler, create=op.create
            )
        if isinstance(op, Sleep):
            return await self.sleep(op.seconds)
        assert keep is not None, "Options.keep without a keep function"
        return await keep(op.index, op.verdict)


def receive(
    body: bytes,
    store: AggregateStore[S],
    handler: Handler[S],
    aggregate_id_of: Callable[[Message], AggregateId],
    *,
    create: bool,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
) -> Verdict:
    """Decode ``body``, handle its message exactly once on the store, and say how to settle.

    ``body`` is a docoutbox entry, a CloudEvent in structured or binary mode (pass the
    delivery's ``headers`` and ``content_type``), or a plain ``{id, type, payload}``
    message (:func:`~docoutbox.codec.decode_message`).

    - ``ACK`` once the outcome is ``applied`` or ``duplicate`` (the commit is durable);
    - ``REQUEUE`` on ``gave_up``, a transient store error, a conflict or a saturated
      inbox; also on a permanent store error, marked ``fatal`` so the consumer stops;
    - ``REJECT`` when the body is malformed, the input invalid, the document would grow
      too large, the aggregate is missing (``create=False``) or the handler raised.
    """
    options = Options(create=create, retry=NO_RETRY)
    receiver = Receiver(store, handler, aggregate_id_of, options)
    return receiver.receive([Delivery(body, headers, content_type)])[0]


async def receive_async(
    body: bytes,
    store: AsyncAggregateStore[S],
    handler: Handler[S],
    aggregate_id_of: Callable[[Message], AggregateId],
    *,
    create: bool,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
) -> Verdict:
    """The async twin of :func:`receive`, over an :class:`AsyncAggregateStore`."""
    options = Options(create=create, retry=NO_RETRY)
    receiver = AsyncReceiver(store, handler, aggregate_id_of, options)
    return (await receiver.receive([Delivery(body, headers, content_type)]))[0]


def receive_retrying(
    body: bytes,
    store: AggregateStore[S],
    handler: Handler[S],
    aggregate_id_of: Callable[[Message], AggregateId],
    *,
    create: bool,
    retry: HandlerRetry,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    headers: Mapping[str, Any] | None = None,
    content_type: str | None = None,
) -> Verdict:
    """:func:`receive`, retried as ``retry`` says while the verdict is a retryable reject.

    Each attempt is a fresh exactly-once handling: a retry after a commit that did happen
    is a duplicate, acked. The verdict's ``attempts`` says how many handlings it took.
    """
    options = Options(create=create, retry=retry)
    receiver = Receiver(store, handler, aggregate_id_of, options, sleep=sleep, rng=rng)
    return receiver.receive([Delivery(body, headers, content_type)])[0]


# --- dead letters, counts and logs, shared by every consumer helper -------------------


class Rejects(Protocol):
    """Where a consumer keeps the deliveries it rejects (e.g. ``MongoDeadLetters``)."""

    def put(
        self,
        aggregate_id: AggregateId | None,
        entry: dict[str, Any],
        error: str,
        attempts: int,
        *,
        origin: str = ...,
        queue: str | None = ...,
        body: str | bytes | None = ...,
    ) -> None: ...


class AsyncRejects(Protocol):
    """The async twin of :class:`Rejects` (e.g. ``AsyncMongoDeadLetters``)."""

    async def put(
        self,
        aggregate_id: AggregateId | None,
        entry: dict[str, Any],
        error: str,
        attempts: int,
        *,
        origin: str = ...,
        queue: str | None = ...,
        body: str | bytes | None = ...,
    ) -> None: ...


#: Where an async consumer keeps what it rejects: a sync or an async dead-letter store.
AnyRejects = Rejects | AsyncRejects


class Stop(Protocol):
    """A consumer's stop flag: a ``threading.Event``, or an ``asyncio.Event``."""

    def is_set(self) -> bool: ...


def rejected(verdict: Verdict, body: bytes, queue: str) -> dict[str, Any]:
    """The arguments of ``Rejects.put`` for a rejected delivery: its entry (the body's
    JSON object, or its text), the aggregate it names, the error, attempts and raw body."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    entry: dict[str, Any] = data if isinstance(data, dict) else {"value": repr(body[:1000])}
    if verdict.message is not None:
        entry.setdefault("id", verdict.message.id)
    aggregate_id = entry.get("aggregate_id")
    try:
        text: str | bytes = body.decode()
    except UnicodeDecodeError:
        text = body
    return {
        "aggregate_id": aggregate_id if isinstance(aggregate_id, str | int) else None,
        "entry": entry,
        "error": describe(verdict),
        "attempts": verdict.attempts,
        "origin": "consume",
        "queue": queue,
        "body": text,
    }


def keep_sync(rejects: Rejects, verdict: Verdict, body: bytes, queue: str) -> None:
    """Keep a rejected delivery in ``rejects``."""
    rejects.put(**rejected(verdict, body, queue))


async def keep_async(
    rejects: Rejects | AsyncRejects, verdict: Verdict, body: bytes, queue: str
) -> None:
    """Keep a rejected delivery in ``rejects``, sync or async."""
    result: Any = rejects.put(**rejected(verdict, body, queue))
    if inspect.isawaitable(result):
        await result


class KeptReceiver:
    """A consumer shell's receiver, built on first use and kept for the next deliveries.

    A subclass names the attributes its receiver is built from in ``receiver_settings``:
    setting one of them drops the kept receiver, and the next use builds it again.
    """

    #: The attributes the receiver is built from.
    receiver_settings: ClassVar[frozenset[str]] = frozenset()
    #: The shell's receiver (a Receiver or an AsyncReceiver), built on first use.
    _receiver: Any = None

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self.receiver_settings:
            super().__setattr__("_receiver", None)


@dataclass
class ConsumerStats:
    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    #: Deliveries given back to be read again (nack with requeue, or a rewound offset).
    requeued: int = 0
    rejected: int = 0
    #: Handlings repeated because the handler failed (HandlerRetry).
    retried: int = 0
    #: Rejected deliveries kept in the dead letters.
    dead_lettered: int = 0
    #: Deliveries read again after a requeue or a lost consumer, as far as the broker says.
    redelivered: int = 0

    def count(self, verdict: Verdict, redelivered: bool) -> None:
        """Count a delivery settled as ``verdict`` says."""
        self.delivered += 1
        self.redelivered += redelivered
        self.retried += max(0, verdict.attempts - 1)
        if verdict.action is Action.ACK:
            if verdict.outcome is not None and verdict.outcome.duplicate:
                self.duplicates += 1
            else:
                self.applied += 1
        elif verdict.action is Action.REQUEUE:
            self.requeued += 1
        else:
            self.rejected += 1
            self.dead_lettered += bool(verdict.kept)


def expected_rejection(verdict: Verdict) -> bool:
    """Whether ``verdict`` rejects a delivery for being what it is (a body that is not a
    message, an unknown type, an invalid payload, a missing aggregate, a document that
    would grow too large): an outcome of normal operation, not a fault of the consumer."""
    return (
        verdict.action is Action.REJECT
        and verdict.keep_error is None
        and isinstance(verdict.error, REJECT_ERRORS)
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def summary(verdict: Verdict, body: bytes) -> str:
    """One line naming the delivery (message ID and type, or the start of a body that is
    not a message) and why it is not acked."""
    message = verdict.message
    if message is None:
        return _one_line(f"a delivery with body {body[:200]!r}: {describe(verdict)}")
    reason = describe(verdict).removeprefix(f"message {message.id}: ")
    return _one_line(f"message {message.id} (type {message.type}): {reason}")


def log_rejection(log: logging.Logger, verdict: Verdict, body: bytes, action: str) -> None:
    """Log a rejected delivery as ``<action> <summary>``: an expected rejection
    (:func:`expected_rejection`) as one warning line, anything else (a handler that
    raised, a dead letter that could not be kept) as an error with its traceback."""
    if expected_rejection(verdict):
        log.warning("%s %s", action, summary(verdict, body))
    else:
        log.error("%s %s", action, summary(verdict, body), exc_info=verdict.error)


def log_verdict(log: logging.Logger, verdict: Verdict, body: bytes, kept: str) -> None:
    """Log a delivery that is not acked; ``kept`` says where a rejected one stays."""
    if verdict.action is Action.REQUEUE:
        log.warning("requeueing %s", summary(verdict, body))
    elif verdict.action is Action.REJECT:
        action = f"rejecting after {verdict.attempts} attempt(s) (kept {kept})"
        log_rejection(log, verdict, body, action)
