"""docoutbox: exactly-once message processing on document databases.

Each aggregate is one document carrying its state, an inbox of processed message IDs and
an outbox of messages not yet published; handling a message is one conditional write.
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
