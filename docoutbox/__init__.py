"""docoutbox: exactly-once message processing on document databases.

Each aggregate is one document carrying its state, an inbox of processed message IDs and
an outbox of messages not yet published; handling a message is one conditional write.
"""

from docoutbox.aggregate import Decision, Handler, Handlers
from docoutbox.document import Snapshot, partition_of
from docoutbox.errors import (
    ConcurrencyConflict,
    DocOutboxError,
    DocumentTooLarge,
    InboxSaturated,
    InvalidAggregateId,
    InvalidHandlerResult,
    InvalidInput,
    InvalidMessage,
    InvalidPayload,
    MalformedDocument,
    NotFound,
    PermanentPublishError,
    PermanentStoreError,
    PublishError,
    StoreError,
    TransientStoreError,
    UnknownMessageType,
)
from docoutbox.flows import Created, Outcome, RetryPolicy, Status, StoreConfig
from docoutbox.model import Aggregate, Emit, InboxPolicy, Message, OutboxMessage, emit
from docoutbox.ports import AsyncStoreBackend, StoreBackend
from docoutbox.store import AggregateStore, AsyncAggregateStore

__version__ = "0.1.0"

__all__ = [
    "Aggregate",
    "AggregateStore",
    "AsyncAggregateStore",
    "AsyncStoreBackend",
    "ConcurrencyConflict",
    "Created",
    "Decision",
    "DocOutboxError",
    "DocumentTooLarge",
    "Emit",
    "Handler",
    "Handlers",
    "InboxPolicy",
    "InboxSaturated",
    "InvalidAggregateId",
    "InvalidHandlerResult",
    "InvalidInput",
    "InvalidMessage",
    "InvalidPayload",
    "MalformedDocument",
    "Message",
    "NotFound",
    "OutboxMessage",
    "Outcome",
    "PermanentPublishError",
    "PermanentStoreError",
    "PublishError",
    "RetryPolicy",
    "Snapshot",
    "Status",
    "StoreBackend",
    "StoreConfig",
    "StoreError",
    "TransientStoreError",
    "UnknownMessageType",
    "__version__",
    "emit",
    "partition_of",
]
