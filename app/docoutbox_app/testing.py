"""Endpoints in memory, for users' tests: no broker, no database, no thread, no clock.

Rule: a :class:`TestBus` runs the endpoints' own handlers, routes, creating types and
retries through the same receive flow and store core as ``docoutbox run`` (only the
database is :class:`~docoutbox.testing.MemoryBackend` and the broker a list), so what a
test sees (state, published messages, duplicates skipped, rejects) is what the endpoint
does. Compare FastStream's ``TestBroker``::

    bus = TestBus(orders, inventory, clock=lambda: NOON)
    bus.send("orders", {"id": "c-1", "type": "PlaceOrder", "payload": {...}})
    bus.run()                       # publish outboxes, deliver to handling endpoints
    assert bus.state("orders", "o-1").status == "reserved"
    assert bus.types() == ["OrderPlaced", "StockReserved"]

A published message is delivered to every endpoint whose :class:`~docoutbox.Handlers`
handle its type, through that endpoint's first input (its route and creating types).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from docoutbox.codec import encode_entry
from docoutbox.dispatch.engine.due import due_order
from docoutbox.handlers import Handlers
from docoutbox.model import AggregateId, Message, OutboxMessage, aggregate_type_of
from docoutbox.receive import Action, Delivery, Options, Receiver, Verdict
from docoutbox.store.api import AggregateStore
from docoutbox.store.core import StoreConfig
from docoutbox.store.document import ID
from docoutbox.testing.memory import MemoryBackend
from docoutbox_app.endpoint.definition import Endpoint, EndpointConfigError, Input

__all__ = ["Delivered", "TestBus"]


@dataclass(frozen=True)
class Delivered:
    """One delivery to an endpoint and how it was settled."""

    endpoint: str
    message_id: str
    message_type: str
    verdict: Verdict

    @property
    def action(self) -> Action:
        return self.verdict.action


class _Running:
    """One endpoint in memory: its store and one receiver per input."""

    def __init__(self, endpoint: Endpoint[Any], clock: Callable[[], datetime] | None) -> None:
        self.endpoint = endpoint
        self.backend = MemoryBackend()
        config: StoreConfig = endpoint.config
        if clock is not None:
            config = replace(config, clock=clock)
        self.store: AggregateStore[Any] = AggregateStore(self.backend, endpoint.aggregate, config)
        self.aggregate_type = aggregate_type_of(endpoint.aggregate)
        self.rejected: list[Verdict] = []
        self.receivers = {item.label: self._receiver(item) for item in endpoint.inputs}

    def _receiver(self, item: Input) -> Receiver[Any]:
        options = Options(retry=self.endpoint.retry, keep=True, creates=item.creates)
        return Receiver(
            self.store,
            self.endpoint.handlers,
            item.route,
            options,
            keep=lambda _, verdict: self.rejected.append(verdict),
            sleep=lambda _: None,  # handler retries happen at once
        )

    def handles(self, message_type: str) -> bool:
        handlers = self.endpoint.handlers
        return isinstance(handlers, Handlers) and message_type in handlers.types


class TestBus:
    """Endpoints wired together in memory (see the module's rule).

    ``clock`` fixes the stores' clock (the handlers' ``context.now`` and the entries'
    ``created_at``), so a test is repeatable.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self, *endpoints: Endpoint[Any], clock: Callable[[], datetime] | None = None
    ) -> None:
        if not endpoints:
            raise EndpointConfigError("TestBus needs at least one endpoint")
        self._endpoints: dict[str, _Running] = {}
        for endpoint in endpoints:
            if not isinstance(endpoint, Endpoint):
                raise EndpointConfigError(f"TestBus takes Endpoints, got {endpoint!r}")
            if endpoint.name in self._endpoints:
                raise EndpointConfigError(f"two endpoints are named {endpoint.name!r}")
            self._endpoints[endpoint.name] = _Running(endpoint, clock)
        #: Every entry published, in publish order (per aggregate, in ``seq`` order).
        self.published: list[OutboxMessage] = []
        #: Every delivery made, in order.
        self.deliveries: list[Delivered] = []
        self._undelivered: list[OutboxMessage] = []

    def _running(self, endpoint: str | Endpoint[Any]) -> _Running:
        name = endpoint.name if isinstance(endpoint, Endpoint) else endpoint
        try:
            return self._endpoints[name]
        except KeyError:
            raise EndpointConfigError(
                f"no endpoint {name!r} on this bus (it has {', '.join(self._endpoints)})"
            ) from None

    # -- sending ------------------------------------------------------------------------

    def send(
        self,
        endpoint: str | Endpoint[Any],
        message: Message | Mapping[str, Any] | bytes,
        *,
        input: str | None = None,
        times: int = 1,
    ) -> list[Delivered]:
        """Deliver ``message`` to ``endpoint`` ``times`` times (a redelivered command),
        through its input labelled ``input`` (default: its first), as a consumer would:
        each delivery is handled exactly once or recognized as a duplicate."""
        running = self._running(endpoint)
        if input is None:
            receiver = next(iter(running.receivers.values()))
        elif input in running.receivers:
            receiver = running.receivers[input]
        else:
            raise EndpointConfigError(
                f"endpoint {running.endpoint.name!r} has no input {input!r} "
                f"(it has {', '.join(running.receivers)})"
            )
        body = _body(message)
        return [self._deliver(running, receiver, body) for _ in range(times)]

    def _deliver(self, running: _Running, receiver: Receiver[Any], body: bytes) -> Delivered:
        verdict = receiver.receive([Delivery(body)])[0]
        message = verdict.message
        delivered = Delivered(
            running.endpoint.name,
            message.id if message is not None else "?",
            message.type if message is not None else "?",
            verdict,
        )
        self.deliveries.append(delivered)
        return delivered

    # -- dispatching --------------------------------------------------------------------

    def dispatch(self) -> list[OutboxMessage]:
        """Publish every pending outbox entry that is due (per aggregate in ``seq`` order;
        scheduled ones once the bus's clock reaches their due time) and trim it, as the
        dispatcher does; cancelled ones are trimmed unpublished. Returns what was
        published now."""
        published: list[OutboxMessage] = []
        for running in self._endpoints.values():
            now = running.store.config.clock()
            for snapshot in list(running.store.pending()):
                doc = {
                    ID: snapshot.aggregate_id,
                    "outbox": list(snapshot.raw_outbox),
                    "cancelled": list(snapshot.cancelled),
                }
                order = due_order(doc, now)
                entries = [OutboxMessage.parse(raw) for raw in order.entries]
                published.extend(entries)
                gone = [entry.id for entry in entries] + list(order.cancelled)
                running.store.trim(snapshot.aggregate_id, gone)
        self.published.extend(published)
        self._undelivered.extend(published)
        return published

    def run(self, *, duplicates: int = 1, max_rounds: int = 100) -> list[Delivered]:
        """Dispatch and deliver until nothing is left to publish: each published message
        goes ``duplicates`` times to every endpoint that handles its type (a broker that
        delivers twice). Returns the deliveries made."""
        if type(duplicates) is not int or duplicates < 1:
            raise EndpointConfigError(f"duplicates must be at least 1, got {duplicates!r}")
        made: list[Delivered] = []
        for _ in range(max_rounds):
            self.dispatch()
            todo, self._undelivered = self._undelivered, []
            if not todo:
                return made
            for entry in todo:
                body = encode_entry(entry)
                for running in self._endpoints.values():
                    if running.handles(entry.type):
                        receiver = next(iter(running.receivers.values()))
                        for _ in range(duplicates):
                            made.append(self._deliver(running, receiver, body))
        raise EndpointConfigError(
            f"messages still flowing after {max_rounds} rounds: a loop between handlers?"
        )

    # -- what a test asserts on -----------------------------------------------------------

    def state(self, endpoint: str | Endpoint[Any], aggregate_id: AggregateId) -> Any:
        """The aggregate's state, or None if it does not exist."""
        snapshot = self._running(endpoint).store.load(aggregate_id)
        return None if snapshot is None else snapshot.state

    def outbox(self, endpoint: str | Endpoint[Any]) -> list[OutboxMessage]:
        """The entries ``endpoint`` has not published yet."""
        store = self._running(endpoint).store
        return [entry for snapshot in store.pending() for entry in snapshot.outbox]

    def rejected(self, endpoint: str | Endpoint[Any]) -> list[Verdict]:
        """The deliveries ``endpoint`` rejected (its dead letters)."""
        return list(self._running(endpoint).rejected)

    def types(self, *, source: str | None = None) -> list[str]:
        """The types of the messages published (by endpoint ``source`` only, if given)."""
        return [
            entry.type
            for entry in self.published
            if source is None or self._source_of(entry) == source
        ]

    def _source_of(self, entry: OutboxMessage) -> str | None:
        for name, running in self._endpoints.items():
            if entry.aggregate_type == running.aggregate_type:
                return name
        return None


def _body(message: Message | Mapping[str, Any] | bytes) -> bytes:
    if isinstance(message, bytes):
        return message
    if isinstance(message, Message):
        return message.model_dump_json().encode()
    return json.dumps(dict(message)).encode()
