"""docoutbox: exactly-once message processing on document databases.

Each aggregate is one document carrying its state, an inbox of processed message IDs and
an outbox of messages not yet published; handling a message is one conditional write.

This package re-exports the names a user needs; the rest is imported from its module:

- :mod:`docoutbox.model`: messages, outbox entries, inbox policy, aggregates;
- :mod:`docoutbox.handlers`: handlers, pure functions from state and message to a decision;
- :mod:`docoutbox.errors`: the error tree, rooted at :class:`DocOutboxError`;
- :mod:`docoutbox.retry`: the one backoff policy;
- :mod:`docoutbox.codec`: the broker body of an entry (plain JSON or a CloudEvent);
- :mod:`docoutbox.receive`: how received entries are settled (ack after commit);
- :mod:`docoutbox.drive`: the loop that drives every sans-IO flow;
- :mod:`docoutbox.store`: the aggregate store;
- :mod:`docoutbox.stored`: what is stored, as stored: encoding (compression, encryption)
  and upcasting of old model versions;
- :mod:`docoutbox.dispatch`: the dispatcher;
- :mod:`docoutbox.ports`: every Protocol an adapter implements;
- :mod:`docoutbox.observability`: OpenTelemetry, Prometheus and health;
- :mod:`docoutbox.testing`: memory ports and contract suites for adapters.
"""

from docoutbox.dispatch.drivers.aio import AsyncDispatcher
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.errors import (
    ConcurrencyConflict,
    DocOutboxError,
    InvalidInput,
    NotFound,
    PublishError,
    StoreError,
)
from docoutbox.handlers import Context, Decision, Handlers
from docoutbox.model import Aggregate, Emit, InboxPolicy, Message, OutboxMessage, emit
from docoutbox.retry import RetryPolicy
from docoutbox.store.api import AggregateStore, AsyncAggregateStore
from docoutbox.store.core import Outcome, Status, StoreConfig

__version__ = "0.1.0"

__all__ = [
    "Aggregate",
    "AggregateStore",
    "AsyncAggregateStore",
    "AsyncDispatcher",
    "ConcurrencyConflict",
    "Context",
    "Decision",
    "Dispatcher",
    "DispatcherConfig",
    "DocOutboxError",
    "Emit",
    "Handlers",
    "InboxPolicy",
    "InvalidInput",
    "Message",
    "NotFound",
    "OutboxMessage",
    "Outcome",
    "PublishError",
    "RetryPolicy",
    "Status",
    "StoreConfig",
    "StoreError",
    "__version__",
    "emit",
]
