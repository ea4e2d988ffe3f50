"""The store's logic as sans-IO generators, written once for sync and async.

A flow yields operations (:class:`Load`, :class:`Write`, :class:`FindPending`,
:class:`Sleep`) and receives their results; a driver in :mod:`docoutbox.store.api` performs
them against a sync or an async backend. Errors raised by an operation are thrown back
into the flow at the ``yield``.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from docoutbox.errors import (
    ConcurrencyConflict,
    DocumentTooLarge,
    InvalidPayload,
    NotFound,
    TransientStoreError,
)
from docoutbox.handlers import Decision, Handler, check_result
from docoutbox.model import (
    AggregateId,
    InboxPolicy,
    Message,
    OutboxMessage,
    aggregate_type_of,
    check_aggregate_id,
)
from docoutbox.retry import RetryPolicy
from docoutbox.store.document import Document, Snapshot, new_document, partition_of, read_snapshot
from docoutbox.store.document import utcnow as _utcnow
from docoutbox.store.inbox import is_duplicate
from docoutbox.store.plans import (
    CommitPlan,
    FailurePlan,
    InsertPlan,
    WritePlan,
    apply_plan,
    guard_size,
    plan_commit,
    plan_trim,
)

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")


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


Op = Load | Write | FindPending | Sleep
Flow = Generator[Op, Any, T]


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
    #: The outbox entries this commit added, as stored.
    entries: tuple[dict[str, Any], ...] = ()

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


@dataclass(frozen=True)
class Created(Generic[S]):
    """The result of an idempotent create: the stored aggregate, and whether we made it."""

    created: bool
    snapshot: Snapshot[S]


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
        self._docs: OrderedDict[AggregateId, tuple[Document, int | None]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, aggregate_id: AggregateId) -> tuple[Document, int | None] | None:
        """The cached document and an upper bound of its size (None: unknown)."""
        with self._lock:
            return self._docs.pop(aggregate_id, None)

    def put(self, aggregate_id: AggregateId, doc: Document, size: int | None) -> None:
        if self._size <= 0 or len(doc.get("outbox") or ()) > self._max_outbox:
            return
        with self._lock:
            self._docs[aggregate_id] = (doc, size)
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
        self._size_of = size_of
        self._limit = limit

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
        retry = self.config.retry
        cached = self.cache.take(aggregate_id)
        doc, known = cached if cached is not None else (None, None)
        fresh = doc is None
        attempt = 0
        while True:
            if fresh:
                known = None
                try:
                    doc = yield Load(aggregate_id)
                except TransientStoreError:
                    attempt += 1
                    if attempt >= retry.max_attempts:
                        raise
                    yield Sleep(retry.delay(attempt, self.config.rng))
                    continue
            base = doc if doc is not None else self._initial(aggregate_id, create)
            snapshot = read_snapshot(base, self.model)
            if is_duplicate(self.config.inbox, snapshot.inbox, snapshot.marks, msg):
                if doc is not None:
                    self.cache.put(aggregate_id, doc, known)
                return Outcome(Status.DUPLICATE, aggregate_id, snapshot.version, attempt)
            decision = check_result(handler(snapshot.state, msg), self.model)
            plan, entries = self._plan(snapshot, msg, decision)
            after = apply_plan(base, plan)
            assert after is not None
            try:
                size = self._measure(after, plan, known, aggregate_id)
            except DocumentTooLarge:
                if fresh:
                    raise
                fresh = True  # the cached copy may still hold entries trimmed since
                continue
            attempt += 1
            try:
                applied = yield Write(plan if doc is not None else InsertPlan(aggregate_id, after))
            except TransientStoreError:
                # The write may or may not have happened: reload and let the inbox decide.
                if attempt >= retry.max_attempts:
                    raise
                applied = False
            if applied:
                self.cache.put(aggregate_id, after, size)
                return Outcome(
                    Status.APPLIED,
                    aggregate_id,
                    after["version"],
                    attempt,
                    decision.state,
                    tuple(entries),
                )
            if attempt >= retry.max_attempts:
                return Outcome(Status.GAVE_UP, aggregate_id, snapshot.version, attempt)
            if fresh:
                yield Sleep(retry.delay(attempt, self.config.rng))
            fresh = True

    def _measure(
        self, after: Document, plan: CommitPlan, known: int | None, aggregate_id: AggregateId
    ) -> int:
        """An upper bound of the document's size after ``plan``; DocumentTooLarge if over.

        From a cached copy of known size, the bound is that size plus everything the plan
        adds (cheap to measure); only when that bound is over the limit is the whole
        document measured. The bound drifts upward, never below the true size.
        """
        if known is not None:
            added = {
                "s": plan.state,
                "o": list(plan.outbox_push),
                "i": list(plan.inbox_push),
                "m": list(plan.inbox_marks or ()),
            }
            slack = 64 + 8 * (len(plan.outbox_push) + len(plan.inbox_push))
            bound = known + self._size_of(added) + slack
            if bound <= self._limit:
                return bound
        size = self._size_of(after)
        if size > self._limit:
            raise DocumentTooLarge(aggregate_id, size, self._limit)
        return size

    def _initial(self, aggregate_id: AggregateId, create: bool) -> Document:
        if not create:
            raise NotFound(f"{self.aggregate_type} {aggregate_id!r} does not exist")
        return self._new_document(aggregate_id, self.model())

    def _new_document(self, aggregate_id: AggregateId, state: S) -> Document:
        return new_document(
            aggregate_id,
            self.aggregate_type,
            _dump_state(state),
            partition_of(aggregate_id, self.config.partitions),
            self.config.clock(),
        )

    def _plan(
        self, snapshot: Snapshot[S], message: Message, decision: Decision[S]
    ) -> tuple[Any, list[dict[str, Any]]]:
        try:
            return plan_commit(
                snapshot,
                message,
                decision,
                policy=self.config.inbox,
                now=self.config.clock(),
                deterministic_ids=self.config.deterministic_ids,
            )
        except PydanticSerializationError as exc:
            raise InvalidPayload(f"state of {snapshot.aggregate_id!r} does not serialize") from exc

    def create(self, aggregate_id: AggregateId, state: S) -> Flow[Created[S]]:
        check_aggregate_id(aggregate_id)
        if not isinstance(state, self.model):
            raise InvalidPayload(f"state must be a {self.model.__name__}")
        doc = self._new_document(aggregate_id, state)
        guard_size(doc, aggregate_id, self._size_of, self._limit)
        if (yield Write(InsertPlan(aggregate_id, doc))):
            self.cache.put(aggregate_id, doc, None)
            return Created(True, read_snapshot(doc, self.model))
        existing = yield Load(aggregate_id)
        if existing is None:
            raise ConcurrencyConflict(f"{aggregate_id!r} existed on insert, then vanished")
        return Created(False, read_snapshot(existing, self.model))

    def load(self, aggregate_id: AggregateId) -> Flow[Snapshot[S] | None]:
        check_aggregate_id(aggregate_id)
        doc = yield Load(aggregate_id)
        return None if doc is None else read_snapshot(doc, self.model)

    def trim(self, aggregate_id: AggregateId, entry_ids: Collection[str]) -> Flow[bool]:
        check_aggregate_id(aggregate_id)
        if not entry_ids:
            return True
        applied: bool = yield Write(plan_trim(aggregate_id, list(entry_ids)))
        return applied

    def record_failure(
        self, aggregate_id: AggregateId, entry_id: str, attempts: int, error: str
    ) -> Flow[bool]:
        check_aggregate_id(aggregate_id)
        applied: bool = yield Write(FailurePlan(aggregate_id, entry_id, attempts, error))
        return applied

    def pending_page(
        self,
        after: AggregateId | None,
        limit: int,
        older_than: datetime | None,
        partitions: Collection[int] | None,
    ) -> Flow[list[Snapshot[S]]]:
        docs = yield FindPending(after, limit, older_than, partitions)
        return [read_snapshot(doc, self.model) for doc in docs]


def _dump_state(state: BaseModel) -> dict[str, Any]:
    try:
        return state.model_dump(mode="json")
    except PydanticSerializationError as exc:
        raise InvalidPayload(f"{type(state).__name__} does not serialize: {exc}") from exc
