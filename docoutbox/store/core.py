"""The store's logic as sans-IO generators, written once for sync and async.

A flow yields operations (:class:`Load`, :class:`Write`, :class:`FindPending`,
:class:`Sleep`) and receives their results; a driver in :mod:`docoutbox.store.api` performs
them against a sync or an async backend. Errors raised by an operation are thrown back
into the flow at the ``yield``.

Rule: a write that does not report success is in doubt until the document says what
happened. Its reply may have been lost (TransientStoreError), or its conflict (409/412)
may be a driver's resend of the write itself, which had applied (``azure.cosmos.aio``
resends by itself). The store reloads the document before it answers, on every driver:
the document the write produced is APPLIED, the message in the inbox otherwise is a
DUPLICATE, and only a document without it is retried, or, with no attempt left, GAVE_UP
(a conflict) or the TransientStoreError (a lost reply). Past ``RetryPolicy.deadline`` the
store does not reload (the database is not answering): its TransientStoreError then says
the write may have applied, as every TransientStoreError of a write does.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from docoutbox.errors import (
    ConcurrencyConflict,
    DocumentTooLarge,
    InvalidConfig,
    InvalidHandlerResult,
    InvalidInput,
    InvalidMessage,
    InvalidPayload,
    NotFound,
    TransientStoreError,
)
from docoutbox.handlers import (
    Context,
    Decision,
    Handler,
    Handlers,
    check_handling,
    check_result,
    takes_context,
)
from docoutbox.model import (
    AggregateId,
    InboxPolicy,
    Message,
    OutboxMessage,
    aggregate_type_of,
    check_aggregate_id,
    is_utf8,
    storable_problem,
    with_article,
)
from docoutbox.retry import MAX_COUNT, RetryPolicy, check_int
from docoutbox.store import spill
from docoutbox.store.document import (
    ID,
    Document,
    Snapshot,
    fast_frozen,
    new_document,
    partition_of,
    read_snapshot,
)
from docoutbox.store.document import utcnow as _utcnow
from docoutbox.store.dump import exactly_typed, plain_fields
from docoutbox.store.inbox import is_duplicate
from docoutbox.store.observe import StoreObserver, with_headers
from docoutbox.store.plans import (
    CommitPlan,
    FailurePlan,
    InsertPlan,
    WritePlan,
    cancelled_keys,
    committed,
    guard_size,
    plan_commit,
    plan_trim,
)
from docoutbox.store.schedule import cancellable
from docoutbox.stored.claim import ClaimCheck, PutPayload, claim_plan
from docoutbox.stored.codec import Codec
from docoutbox.stored.upcast import STATE_VERSION, Upcasters
from docoutbox.stored.values import StoredValues

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")

log = logging.getLogger("docoutbox.store")


@dataclass(frozen=True)
class Load:
    aggregate_id: AggregateId


@dataclass(frozen=True)
class Write:
    plan: WritePlan


@dataclass(frozen=True)
class FindPending:
    after: AggregateId | None
    limit: int
    older_than: datetime | None
    partitions: Collection[int] | None


@dataclass(frozen=True)
class Sleep:
    seconds: float


Op = Load | Write | FindPending | Sleep | PutPayload | spill.Archive | spill.Archived
Flow = Generator[Op, Any, T]

#: The most partitions a store may spread its documents over.
MAX_PARTITIONS = 65_536
#: The largest ``pending()`` page.
MAX_BATCH = 100_000
#: The most publish attempts :meth:`Core.record_failure` accepts (a 32-bit counter).
MAX_ATTEMPTS = MAX_COUNT
#: The longest message ID (as :class:`~docoutbox.model.Message` accepts).
MAX_MESSAGE_ID = 512


@dataclass(frozen=True)
class StoreConfig:
    """How a store de-duplicates, retries, numbers and partitions."""

    inbox: InboxPolicy = field(default_factory=InboxPolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    deterministic_ids: bool = False
    partitions: int = 16
    cache_size: int = 1024
    clock: Callable[[], datetime] = _utcnow
    rng: random.Random = field(default_factory=random.Random)
    #: Tracing and metrics hooks (:mod:`docoutbox.store.observe`); None: none.
    observer: StoreObserver | None = None
    #: Seconds on a monotonic clock, which ``retry.deadline`` is measured with.
    timer: Callable[[], float] = time.monotonic
    #: Encodes the state and entry values it stores (compression, encryption); None:
    #: stored plain (:mod:`docoutbox.stored`).
    codec: Codec | None = None
    #: Turn old stored states and entry payloads into the current model on read.
    upcasters: Upcasters | None = None
    #: Move payloads above a size to a payload store (:mod:`docoutbox.stored.claim`);
    #: None: every payload stays in its entry.
    claim_check: ClaimCheck | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.inbox, InboxPolicy):
            raise InvalidConfig(
                f"StoreConfig.inbox must be an InboxPolicy, got {type(self.inbox).__name__}"
            )
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidConfig(
                f"StoreConfig.retry must be a RetryPolicy, got {type(self.retry).__name__}"
            )
        if type(self.deterministic_ids) is not bool:
            raise InvalidConfig(
                f"StoreConfig.deterministic_ids must be a bool, got {self.deterministic_ids!r}"
            )
        check_int("StoreConfig.partitions", self.partitions, 1, MAX_PARTITIONS)
        check_int("StoreConfig.cache_size", self.cache_size, 0, 10_000_000)
        if not callable(self.clock):
            raise InvalidConfig(f"StoreConfig.clock must be callable, got {self.clock!r}")
        if not callable(self.timer):
            raise InvalidConfig(f"StoreConfig.timer must be callable, got {self.timer!r}")
        if not isinstance(self.rng, random.Random):
            raise InvalidConfig(
                f"StoreConfig.rng must be a random.Random, got {type(self.rng).__name__}"
            )
        StoredValues(self.codec, self.upcasters)  # refuses a codec or upcasters of a wrong type
        if self.claim_check is not None and not isinstance(self.claim_check, ClaimCheck):
            raise InvalidConfig(
                "StoreConfig.claim_check must be a ClaimCheck, "
                f"got {type(self.claim_check).__name__}"
            )
        if self.observer is not None and not isinstance(self.observer, StoreObserver):
            raise InvalidConfig(
                "StoreConfig.observer must implement docoutbox.store.observe.StoreObserver, "
                f"got {type(self.observer).__name__}"
            )


@dataclass(frozen=True)
class Doubt:
    """A write that did not report success: its reply was lost (``error``), or it
    conflicted, possibly with a resend of itself that had applied. ``final``: no attempt
    is left after it."""

    after: Document
    entries: tuple[dict[str, Any], ...]
    state: Any
    error: TransientStoreError | None
    final: bool


class Status(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    GAVE_UP = "gave_up"


@dataclass(frozen=True)
class Outcome(Generic[S]):
    """What handling a message did. Acknowledge the message unless ``status`` is GAVE_UP."""

    status: Status
    aggregate_id: AggregateId
    version: int
    attempts: int
    state: S | None = None
    #: The outbox entries this commit added, in plain form (decoded, whatever the codec).
    entries: tuple[dict[str, Any], ...] = ()
    #: The keys of the scheduled entries this commit cancelled.
    cancelled: tuple[str, ...] = ()

    @cached_property
    def emitted(self) -> tuple[OutboxMessage, ...]:
        """The outbox entries this commit added."""
        return tuple(OutboxMessage.parse(entry) for entry in self.entries)

    @property
    def applied(self) -> bool:
        return self.status is Status.APPLIED

    @property
    def duplicate(self) -> bool:
        return self.status is Status.DUPLICATE

    @property
    def gave_up(self) -> bool:
        """True when conflicts outlasted the retries: nothing was written; redeliver.

        Read from the document: after its last conflict (or lost reply) the store reloads
        the document, and a write that did land (a driver's resend of it is what
        conflicted) is APPLIED or DUPLICATE instead."""
        return self.status is Status.GAVE_UP


@dataclass(frozen=True)
class Created(Generic[S]):
    """The result of an idempotent create: the stored aggregate, and whether we made it."""

    created: bool
    snapshot: Snapshot[S]


#: A cached document, its size bound and its state as read back (or None).
Cached = tuple[Document, int | None, Any]


class DocumentCache:
    """The last document this process wrote, per aggregate, so a commit needs no reload.

    An entry is taken out while a handler runs on it and put back only after a
    successful commit or a duplicate, so a handler can never corrupt it. A stale entry
    costs one failed conditional write and a reload, never a wrong result.

    Trims do not change ``version``, so a cached copy keeps entries that were published
    and trimmed since. A copy holding more than ``max_outbox`` entries is not kept: the
    next commit reloads the document instead of carrying (and measuring) a stale backlog.
    """

    def __init__(self, size: int, max_outbox: int = 64) -> None:
        self._size = size
        self._max_outbox = max_outbox
        self._docs: OrderedDict[AggregateId, Cached] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, aggregate_id: AggregateId) -> Cached | None:
        """The cached document, an upper bound of its size (None: unknown) and its state
        as read back (None: not read yet)."""
        with self._lock:
            return self._docs.pop(aggregate_id, None)

    def put(
        self, aggregate_id: AggregateId, doc: Document, size: int | None, state: Any = None
    ) -> None:
        """Keep ``doc``. ``state``, when given, must be the model read from ``doc["state"]``
        and held by nobody else: the next handler receives it instead of a fresh read."""
        if self._size <= 0 or len(doc.get("outbox") or ()) > self._max_outbox:
            return
        with self._lock:
            self._docs[aggregate_id] = (doc, size, state)
            self._docs.move_to_end(aggregate_id)
            while len(self._docs) > self._size:
                self._docs.popitem(last=False)


class Core(Generic[S]):
    """Everything a store does, as flows. Shared by the sync and async stores."""

    def __init__(
        self, model: type[S], config: StoreConfig, size_of: Callable[[Document], int], limit: int
    ) -> None:
        self.model = model
        self.aggregate_type = aggregate_type_of(model)
        self.config = config
        self.cache = DocumentCache(config.cache_size)
        #: What encodes, decodes and upcasts stored values (None: the plain path).
        self.values = StoredValues.of(config.codec, config.upcasters)
        self._size_of = size_of
        self._limit = limit
        self._warned = False
        #: The model's fields when all are plain (:mod:`docoutbox.store.dump`), else None.
        self._plain = plain_fields(model)

    def transient(self, error: TransientStoreError, started: float) -> TransientStoreError | None:
        """The error to raise instead of retrying ``error`` (None: retry it) for a call that
        began at ``started`` (``config.timer``): one naming the deadline, once
        ``retry.deadline`` has passed. The first retried error of the store is logged, once,
        as a warning naming the bound."""
        retry = self.config.retry
        elapsed = self.config.timer() - started
        if retry.out_of_time(elapsed):
            return TransientStoreError(
                f"{self.aggregate_type} store: gave up after {elapsed:.1f} s of transient errors "
                f"(RetryPolicy.deadline={retry.deadline:g} s): {error}"
            )
        if not self._warned:
            self._warned = True
            log.warning(
                "%s store: %s; retrying for up to %s (RetryPolicy.deadline)",
                self.aggregate_type,
                error,
                "ever" if retry.deadline is None else f"{retry.deadline:g} s",
            )
        return None

    def _read_again(self, error: TransientStoreError, attempt: int, started: float) -> Flow[None]:
        """Wait before reading again after ``error``, the ``attempt``-th failure of a call
        that began at ``started``; raise instead once the attempts or the deadline run out."""
        retry = self.config.retry
        if attempt >= retry.max_attempts:
            raise error
        if (late := self.transient(error, started)) is not None:
            raise late from error
        self._observed_retry("transient")
        yield Sleep(retry.delay(attempt, self.config.rng))

    def handle(
        self,
        aggregate_id: AggregateId,
        message: Message | dict[str, Any],
        handler: Handler[S],
        *,
        create: bool,
    ) -> Flow[Outcome[S]]:
        check_aggregate_id(aggregate_id)
        msg: Message = Message.parse(message)
        if type(handler) is Handlers and type(create) is bool:
            contextual = True  # what the checks below answer for a Handlers registry
        else:
            check_handling(handler, create)
            contextual = takes_context(handler)
        config = self.config
        retry, policy = config.retry, config.inbox
        cached = self.cache.take(aggregate_id)
        doc, known, state = cached if cached is not None else (None, None, None)
        fresh = doc is None
        attempt = 0
        started = config.timer()
        #: A write whose outcome the store has yet to read from the document.
        doubt: Doubt | None = None
        while True:
            if fresh:
                known = state = None
                try:
                    doc = yield Load(aggregate_id)
                except TransientStoreError as exc:
                    attempt += 1
                    yield from self._read_again(exc, attempt, started)
                    continue
                if doubt is not None and (landed := self._landed(doc, msg, doubt, attempt)):
                    return landed
            base = doc if doc is not None else self._initial(aggregate_id, create)
            snapshot = read_snapshot(base, self.model, state, self.values)
            duplicate = is_duplicate(policy, snapshot.inbox, snapshot.marks, msg)
            if not duplicate and policy.spill and (lookup := spill.lookup(policy, doc, msg)):
                try:
                    duplicate = msg.id in (yield lookup)
                except TransientStoreError as exc:
                    attempt += 1
                    yield from self._read_again(exc, attempt, started)
                    fresh = True
                    continue
            if duplicate:
                if doc is not None:
                    self.cache.put(aggregate_id, doc, known, snapshot.state)
                return Outcome(Status.DUPLICATE, aggregate_id, snapshot.version, attempt)
            if doubt is not None and doubt.final:
                # Out of attempts, and the document shows the write did not land.
                if doubt.error is not None:
                    raise doubt.error
                return Outcome(Status.GAVE_UP, aggregate_id, snapshot.version, attempt)
            doubt = None
            # From here on the handler may have changed snapshot.state in place.
            state = None
            decision = self.decide(handler, contextual, aggregate_id, snapshot.state, msg, snapshot)
            stored, readable = self._state_document(decision.state, InvalidHandlerResult)
            plan, entries = self._plan(snapshot, msg, decision, stored)
            if config.claim_check is not None:
                plan = yield from self.claim(plan)
            if policy.spill:
                plan = spill.plan_spill(plan, doc, policy)
            after = committed(base, plan)
            assert after is not None
            try:
                size = self._measure(after, plan, known, aggregate_id)
            except DocumentTooLarge:
                if not fresh:
                    fresh = True  # the cached copy may still hold entries trimmed since
                    continue
                plan = spill.plan_spill(plan, doc, policy, everything=True)
                if not plan.inbox_spilled:
                    raise
                after = committed(base, plan)
                assert after is not None
                size = self._measure(after, plan, None, aggregate_id)
            attempt += 1
            lost: TransientStoreError | None = None
            try:
                if doc is not None and not plan.inbox_spilled:  # the usual commit: one write
                    applied = yield fast_frozen(Write, plan=plan)
                else:
                    applied, plan = yield from spill.commit_steps(
                        plan, Write, None if doc is not None else InsertPlan(aggregate_id, after)
                    )
                    after = spill.written(after, plan)
            except TransientStoreError as exc:
                # The write may or may not have happened: the document will say.
                if (late := self.transient(exc, started)) is not None:
                    raise late from exc
                applied, lost = False, exc
            if applied:
                self.cache.put(aggregate_id, after, size, readable)
                outcome: Outcome[S] = object.__new__(Outcome)
                outcome.__dict__.update(  # fast_frozen(Outcome, ...) without its call
                    status=Status.APPLIED,
                    aggregate_id=aggregate_id,
                    version=after["version"],
                    attempts=attempt,
                    state=decision.state,
                    entries=tuple(entries),
                    cancelled=cancelled_keys(snapshot, plan) if plan.cancel_ids else (),
                )
                return outcome
            # A conflict may be a resend of this very write that had applied (a driver
            # that resends after a lost reply gets 409/412 for its own write): like a lost
            # reply, it is settled by reading the document before any answer.
            final = attempt >= retry.max_attempts
            doubt = Doubt(after, tuple(entries), decision.state, lost, final)
            observer = config.observer
            if lost is None and observer is not None:
                observer.conflict(self.aggregate_type)
            if not final:
                self._observed_retry("transient" if lost is not None else "conflict")
                if fresh:
                    yield Sleep(retry.delay(attempt, self.config.rng))
            fresh = True

    def _landed(
        self, doc: Document | None, message: Message, doubt: Doubt, attempt: int
    ) -> Outcome[S] | None:
        """APPLIED when ``doc`` is the document the write in doubt produced: its version
        and ``outbox_seq``, the message in its inbox and the write's entries in its outbox
        (entries trimmed since leave it to the usual reading: a duplicate). Else None."""
        after = doubt.after
        if doc is None or doc.get("version") != after["version"]:
            return None
        if doc.get("outbox_seq") != after.get("outbox_seq"):
            return None
        present = {e.get("id") for e in doc.get("outbox") or () if isinstance(e, dict)}
        if not all(entry["id"] in present for entry in doubt.entries):
            return None
        snapshot = read_snapshot(doc, self.model, values=self.values)
        if not is_duplicate(self.config.inbox, snapshot.inbox, snapshot.marks, message):
            return None
        self.cache.put(doc[ID], doc, None)
        return Outcome(
            Status.APPLIED, doc[ID], after["version"], attempt, doubt.state, doubt.entries
        )

    def decide(
        self,
        handler: Handler[S],
        contextual: bool,
        aggregate_id: AggregateId,
        state: S,
        message: Message,
        snapshot: Snapshot[S] | None = None,
    ) -> Decision[S]:
        """Run ``handler`` on ``state`` (with a :class:`~docoutbox.handlers.Context` when
        ``contextual``, as :func:`~docoutbox.handlers.takes_context` said) and check what
        it returned. ``snapshot`` tells the context which scheduled entries are pending.

        A :class:`~docoutbox.handlers.Handlers` hands over the message type's own handler,
        so a context (and a reading of the clock) is made only for a handler that takes
        one."""
        if type(handler) is Handlers:
            handler, contextual = handler.resolve(message.type)
        if contextual:
            scheduled = None
            if snapshot is not None and snapshot.raw_outbox:
                found = cancellable(snapshot.raw_outbox, snapshot.cancelled)
                scheduled = {key: due for key, (_, due) in found.items()}
            context = Context.of(
                aggregate_id, self.aggregate_type, message, self.config.clock(), scheduled
            )
            return check_result(handler(state, message, context), self.model)
        return check_result(handler(state, message), self.model)

    def _observed_retry(self, reason: str) -> None:
        if self.config.observer is not None:
            self.config.observer.retry(self.aggregate_type, reason)

    def _measure(
        self, after: Document, plan: CommitPlan, known: int | None, aggregate_id: AggregateId
    ) -> int:
        """An upper bound of the document's size after ``plan``; DocumentTooLarge if over.

        From a cached copy of known size, the bound is that size plus everything the plan
        adds (cheap to measure); only when that bound is over the limit is the whole
        document measured. The bound drifts upward, never below the true size.
        """
        if known is not None:
            # Only the parts the plan adds (encoding an empty list costs as much as a value).
            added: Document = {"s": plan.state}
            if plan.outbox_push:
                added["o"] = plan.outbox_push
            if plan.inbox_push:
                added["i"] = plan.inbox_push
            if plan.inbox_marks:
                added["m"] = plan.inbox_marks
            slack = 64 + 8 * (len(plan.outbox_push) + len(plan.inbox_push))
            if plan.inbox_spill is not None:
                added["x"] = plan.inbox_spill
                slack += spill.SLACK  # the archive's token, set after this measure
            bound = known + self._size_of(added) + slack
            if bound <= self._limit:
                return bound
        size = self._size_of(after)
        if plan.inbox_spill is not None:
            size += spill.SLACK  # room for the archive's token, set after this measure
        if size > self._limit:
            raise DocumentTooLarge(aggregate_id, size, self._limit)
        return size

    def _initial(self, aggregate_id: AggregateId, create: bool) -> Document:
        if not create:
            raise NotFound(f"{self.aggregate_type} {aggregate_id!r} does not exist")
        try:
            initial = self.model()
        except ValidationError as exc:
            raise InvalidPayload(
                f"{self.model.__name__} has required fields: create the aggregate with "
                f"store.create() instead of handle(create=True): {exc}"
            ) from exc
        return self._new_document(aggregate_id, initial)

    def _new_document(self, aggregate_id: AggregateId, state: object) -> Document:
        stored, _ = self._state_document(state, InvalidPayload)
        return self.new_document(aggregate_id, stored)

    def new_document(self, aggregate_id: AggregateId, state: dict[str, Any]) -> Document:
        """A new document holding ``state`` (in plain stored form), sealed."""
        values = self.values
        version = None
        if values is not None:
            state, version = values.seal_state(self.aggregate_type, aggregate_id, state)
        doc = new_document(
            aggregate_id,
            self.aggregate_type,
            state,
            partition_of(aggregate_id, self.config.partitions),
            self.config.clock(),
        )
        if version is not None:
            doc[STATE_VERSION] = version
        return doc

    def seal(self, plan: CommitPlan) -> CommitPlan:
        """``plan`` with its state and new entries in stored form (encoded, versioned)."""
        values = self.values
        if values is None:
            return plan
        state, version = values.seal_state(self.aggregate_type, plan.aggregate_id, plan.state)
        pushed = tuple(values.seal_entry(entry) for entry in plan.outbox_push)
        return replace(plan, state=state, state_version=version, outbox_push=pushed)

    def claim(self, plan: CommitPlan) -> Flow[CommitPlan]:
        """``plan`` with its large payloads put in the payload store and referenced
        (:func:`~docoutbox.stored.claim.claim_plan`); as it is without a claim check."""
        claim = self.config.claim_check
        if claim is None or not plan.outbox_push:
            return plan
        config = self.config
        return (yield from claim_plan(plan, claim, config.clock, config.timer, config.rng))

    def _state_document(
        self, state: object, invalid: type[InvalidInput]
    ) -> tuple[dict[str, Any], S]:
        """The stored form of ``state`` and the state as it will be read back.

        Raises ``invalid`` unless ``state`` is exactly the store's model and what would be
        stored reads back through the model's own validation (so ``model_copy(update=...)``
        or ``model_construct`` with wrong types, or a subclass, are refused), and
        InvalidPayload for text that is not UTF-8 or a non-finite float. Nothing is
        written either way.
        """
        model = self.model
        if type(state) is not model:
            raise invalid(
                f"state must be exactly {with_article(model.__name__)}, got {type(state).__name__}"
            )
        values = state.__dict__
        plain = self._plain
        # warnings="error" refuses a field holding another type; it cannot fire, and
        # storable_problem finds nothing, when every value of a plain model has its
        # field's exact type and is storable (docoutbox.store.dump).
        checked = plain is None or not exactly_typed(values, plain)
        if checked:
            extra = state.__pydantic_extra__
            problem = storable_problem(values)  # what storable_problem(state) checks
            if problem is None and extra:
                problem = storable_problem(extra)
            if problem is not None:
                raise InvalidPayload(f"{model.__name__} state: {problem}")
        try:
            stored: dict[str, Any] = model.__pydantic_serializer__.to_python(
                state, mode="json", warnings="error" if checked else False
            )
        except (PydanticSerializationError, ValueError, TypeError, AttributeError) as exc:
            raise invalid(f"{model.__name__} state does not serialize: {exc}") from exc
        try:
            readable: S = model.__pydantic_validator__.validate_python(stored)
        except ValidationError as exc:
            raise invalid(f"{model.__name__} state would not read back: {exc}") from exc
        return stored, readable

    def _plan(
        self, snapshot: Snapshot[S], message: Message, decision: Decision[S], state: dict[str, Any]
    ) -> tuple[Any, list[dict[str, Any]]]:
        plan, entries = plan_commit(
            snapshot,
            message,
            decision,
            policy=self.config.inbox,
            now=self.config.clock(),
            deterministic_ids=self.config.deterministic_ids,
            state=state,
        )
        observer = self.config.observer
        if observer is not None and entries:
            entries = with_headers(entries, observer.headers(message))
            plan = replace(plan, outbox_push=tuple(entries))
        return (plan if self.values is None else self.seal(plan)), entries

    def create(self, aggregate_id: AggregateId, state: S) -> Flow[Created[S]]:
        check_aggregate_id(aggregate_id)
        doc = self._new_document(aggregate_id, state)
        guard_size(doc, aggregate_id, self._size_of, self._limit)
        if (yield Write(InsertPlan(aggregate_id, doc))):
            self.cache.put(aggregate_id, doc, None)
            return Created(True, read_snapshot(doc, self.model, values=self.values))
        existing = yield Load(aggregate_id)
        if existing is None:
            raise ConcurrencyConflict(f"{aggregate_id!r} existed on insert, then vanished")
        return Created(False, read_snapshot(existing, self.model, values=self.values))

    def load(self, aggregate_id: AggregateId) -> Flow[Snapshot[S] | None]:
        check_aggregate_id(aggregate_id)
        doc = yield Load(aggregate_id)
        return None if doc is None else read_snapshot(doc, self.model, values=self.values)

    def trim(self, aggregate_id: AggregateId, entry_ids: Collection[str]) -> Flow[bool]:
        check_aggregate_id(aggregate_id)
        if isinstance(entry_ids, str | bytes) or not isinstance(entry_ids, Collection):
            raise InvalidMessage(
                f"entry_ids must be a collection of entry IDs, got {type(entry_ids).__name__}"
            )
        ids = [_check_entry_id(item) for item in entry_ids]
        if not ids:
            return True
        applied: bool = yield Write(plan_trim(aggregate_id, ids))
        return applied

    def record_failure(
        self, aggregate_id: AggregateId, entry_id: str, attempts: int, error: str
    ) -> Flow[bool]:
        check_aggregate_id(aggregate_id)
        _check_entry_id(entry_id)
        if type(attempts) is not int or not 0 <= attempts <= MAX_ATTEMPTS:
            raise InvalidMessage(
                f"attempts must be an int from 0 to {MAX_ATTEMPTS}, got {attempts!r}"
            )
        if not isinstance(error, str) or not is_utf8(error):
            raise InvalidMessage(f"error must be UTF-8 text, got {type(error).__name__}")
        applied: bool = yield Write(FailurePlan(aggregate_id, entry_id, attempts, str(error)))
        return applied

    def check_pending(
        self,
        batch_size: object,
        older_than: object,
        partitions: object,
    ) -> None:
        """Refuse bad ``pending()`` arguments before the first query."""
        if type(batch_size) is not int or not 1 <= batch_size <= MAX_BATCH:
            raise InvalidInput(
                f"batch_size must be an int from 1 to {MAX_BATCH}, got {batch_size!r}"
            )
        if older_than is not None and (
            not isinstance(older_than, datetime) or older_than.tzinfo is None
        ):
            raise InvalidInput(f"older_than must be a timezone-aware datetime, got {older_than!r}")
        if partitions is not None:
            if isinstance(partitions, str | bytes) or not isinstance(partitions, Collection):
                raise InvalidInput(f"partitions must be a collection of ints, got {partitions!r}")
            for number in partitions:
                if type(number) is not int or not 0 <= number < self.config.partitions:
                    raise InvalidInput(
                        f"partitions must be ints from 0 to {self.config.partitions - 1}, "
                        f"got {number!r}"
                    )

    def pending_page(
        self,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None,
        partitions: Collection[int] | None,
    ) -> Flow[list[Snapshot[S]]]:
        docs = yield FindPending(after, limit, older_than, partitions)
        return [read_snapshot(doc, self.model, values=self.values) for doc in docs]


def _check_entry_id(entry_id: object) -> str:
    """``entry_id`` if it is a plain, non-empty UTF-8 string (never an operator document)."""
    if not isinstance(entry_id, str):
        raise InvalidMessage(f"an entry ID must be a str, got {type(entry_id).__name__}")
    if not 1 <= len(entry_id) <= MAX_MESSAGE_ID or not is_utf8(entry_id):
        raise InvalidMessage(
            f"an entry ID must be UTF-8 text of 1 to {MAX_MESSAGE_ID} characters: {entry_id!r}"
        )
    return str(entry_id)
