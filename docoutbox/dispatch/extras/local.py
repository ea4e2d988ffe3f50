"""Broker-less delivery: a publisher that hands entries to aggregates in the same database.

Rule: delivering an entry *is* handling it on the receiving aggregate, through
``store.handle``: the receiver's state change, its inbox mark and its own outgoing entries
are one conditional write. The dispatcher trims the sender's entry only after that write
(or after finding the entry already in the receiver's inbox), so a process spanning
several aggregates moves all-or-nothing, step by step, without a broker; redelivery after
any crash is absorbed by the receiver's inbox (exactly once). Entries carry ``source``
and ``seq``, so receivers may use exact de-duplication (``InboxPolicy(exact=True)``).

Routing is by ``destination``: ``"<route>/<aggregate id>"`` names a route and the
receiving aggregate; a bare ``"<route>"`` lets the route compute the aggregate ID from
the entry. A missing route or a handler that refuses the message is permanent (the
dispatcher quarantines the entry). A receiving store that cannot be reached
(:class:`~docoutbox.errors.TransientStoreError`: a timeout, throttling, a failover) is
:class:`~docoutbox.errors.BrokerUnavailable`, as a broker that is away: the entry stays
pending and the attempt does not count against it. Another store failure, or a receiver
that kept conflicting, is a :class:`~docoutbox.errors.PublishError`, retried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from docoutbox.errors import (
    BrokerUnavailable,
    DocOutboxError,
    InvalidConfig,
    InvalidInput,
    PermanentPublishError,
    PublishError,
    StoreError,
    TransientStoreError,
)
from docoutbox.handlers import Handler
from docoutbox.model import AggregateId, OutboxMessage
from docoutbox.store.api import AggregateStore, AsyncAggregateStore
from docoutbox.store.core import Outcome, Status


@dataclass(frozen=True)
class Route:
    """Where entries for one destination go: a store, its handler, and how to find the ID.

    The store is an :class:`AggregateStore` for :class:`LocalPublisher` and an
    :class:`AsyncAggregateStore` for :class:`AsyncLocalPublisher`.
    """

    store: AggregateStore[Any] | AsyncAggregateStore[Any]
    handler: Handler[Any]
    #: The receiving aggregate's ID, for destinations without one.
    aggregate_id: Callable[[OutboxMessage], AggregateId] | None = None
    #: Start a missing receiver from its model's defaults (else: permanent failure).
    create: bool = False


class _Router:
    """Routing, error translation and counting, shared by the sync and async publishers."""

    def __init__(self, routes: Mapping[str, Route], store_type: type) -> None:
        if not isinstance(routes, Mapping):
            raise InvalidConfig(
                f"{type(self).__name__} takes a mapping of destinations to Routes, "
                f"got {type(routes).__name__}"
            )
        for name, route in routes.items():
            if not isinstance(route, Route):
                raise InvalidConfig(f"route {name!r} must be a Route, got {type(route).__name__}")
            if not callable(route.handler):
                raise InvalidConfig(f"route {name!r}: its handler must be callable")
            if not isinstance(route.store, store_type):
                raise InvalidInput(
                    f"route {name!r}: {type(self).__name__} needs an {store_type.__name__}"
                )
        self.routes = dict(routes)
        #: Entries handled by their receiver, and entries it had handled already.
        self.delivered = 0
        self.duplicates = 0

    def resolve(self, entry: OutboxMessage) -> tuple[Route, AggregateId]:
        destination = entry.destination
        if not destination:
            raise PermanentPublishError(f"entry {entry.id} has no destination")
        name, _, target = destination.partition("/")
        route = self.routes.get(name)
        if route is None:
            raise PermanentPublishError(f"entry {entry.id}: no route for {destination!r}")
        if target:
            return route, target
        if route.aggregate_id is None:
            raise PermanentPublishError(
                f"entry {entry.id}: destination {destination!r} names no aggregate"
            )
        try:
            return route, route.aggregate_id(entry)
        except (KeyError, TypeError, ValueError) as exc:
            raise PermanentPublishError(
                f"entry {entry.id}: cannot route {destination!r}: {exc!r}"
            ) from exc

    @staticmethod
    @contextmanager
    def _translated(entry: OutboxMessage) -> Iterator[None]:
        """The receiver's errors as publish errors: retried, or permanent."""
        try:
            yield
        except TransientStoreError as exc:
            raise BrokerUnavailable(f"entry {entry.id}: receiving store away: {exc!r}") from exc
        except StoreError as exc:
            raise PublishError(f"entry {entry.id}: store failed: {exc!r}") from exc
        except DocOutboxError as exc:
            raise PermanentPublishError(f"entry {entry.id}: refused: {exc!r}") from exc
        except Exception as exc:  # a failing handler: quarantined with its error
            raise PermanentPublishError(f"entry {entry.id}: handler failed: {exc!r}") from exc

    def _count(
        self, entry: OutboxMessage, aggregate_id: AggregateId, outcome: Outcome[Any]
    ) -> None:
        if outcome.status is Status.GAVE_UP:
            raise PublishError(f"entry {entry.id}: {aggregate_id!r} kept conflicting")
        if outcome.duplicate:
            self.duplicates += 1
        else:
            self.delivered += 1


class LocalPublisher(_Router):
    """A :class:`~docoutbox.ports.dispatch.Publisher` that delivers by ``store.handle``.

    >>> publisher = LocalPublisher({"Stock": Route(stock_store, stock_handlers)})
    >>> Dispatcher(order_backend, publisher, dead_letters, ...)
    """

    def __init__(self, routes: Mapping[str, Route]) -> None:
        super().__init__(routes, AggregateStore)

    def publish(self, entry: OutboxMessage) -> None:
        route, aggregate_id = self.resolve(entry)
        store: Any = route.store
        with self._translated(entry):
            outcome = store.handle(
                aggregate_id, entry.to_message(), route.handler, create=route.create
            )
        self._count(entry, aggregate_id, outcome)


class AsyncLocalPublisher(_Router):
    """The async twin of :class:`LocalPublisher`, over :class:`AsyncAggregateStore` routes."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        super().__init__(routes, AsyncAggregateStore)

    async def publish(self, entry: OutboxMessage) -> None:
        route, aggregate_id = self.resolve(entry)
        store: Any = route.store
        with self._translated(entry):
            outcome = await store.handle(
                aggregate_id, entry.to_message(), route.handler, create=route.create
            )
        self._count(entry, aggregate_id, outcome)
