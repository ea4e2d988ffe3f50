"""docoutbox: exactly-once message processing on document databases.

Each aggregate is one document carrying its state, an inbox of processed message IDs and
an outbox of messages not yet published; handling a message is one conditional write.
"""

from docoutbox.dispatch.drivers.aio import AsyncDispatcher, in_thread
from docoutbox.dispatch.drivers.ownership import LeaseKeeper, SoleOwner
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.dispatch.engine.flow import DispatchPolicy, DispatchResult
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.dispatch.engine.metrics import CountingMetrics, LoggingMetrics, Metrics, NullMetrics
from docoutbox.dispatch.extras.immediate import AsyncImmediateDispatcher, ImmediateDispatcher
from docoutbox.dispatch.extras.local import AsyncLocalPublisher, LocalPublisher, Route
from docoutbox.dispatch.extras.settled import AsyncSettledPublisher, SettledPublisher
from docoutbox.errors import (
    BrokerUnavailable,
    ChangeStreamLost,
    ConcurrencyConflict,
    DocOutboxError,
    DocumentTooLarge,
    InboxSaturated,
    InvalidAggregateId,
    InvalidConfig,
    InvalidHandlerResult,
    InvalidInput,
    InvalidMessage,
    InvalidPayload,
    MalformedDocument,
    NotFound,
    PartitionMismatch,
    PermanentPublishError,
    PermanentStoreError,
    PublishError,
    StoreError,
    TransientStoreError,
    UnknownMessageType,
)
from docoutbox.handlers import Decision, Handler, Handlers
from docoutbox.model import Aggregate, Emit, InboxPolicy, Message, OutboxMessage, emit
from docoutbox.ports.dispatch import (
    AsyncChangeSource,
    AsyncCheckpoints,
    AsyncDeadLetters,
    AsyncPublisher,
    ChangeEvent,
    ChangeSource,
    Checkpoints,
    DeadLetters,
    LeaseTable,
    Ownership,
    Publisher,
)
from docoutbox.ports.store import AsyncStoreBackend, StoreBackend
from docoutbox.retry import RetryPolicy
from docoutbox.store.api import AggregateStore, AsyncAggregateStore
from docoutbox.store.batch import BatchOutcome, Failed
from docoutbox.store.core import Created, Outcome, Status, StoreConfig
from docoutbox.store.document import Snapshot, partition_of

__version__ = "0.1.0"

__all__ = [
    "Aggregate",
    "AggregateStore",
    "AsyncAggregateStore",
    "AsyncChangeSource",
    "AsyncCheckpoints",
    "AsyncDeadLetters",
    "AsyncDispatcher",
    "AsyncImmediateDispatcher",
    "AsyncLocalPublisher",
    "AsyncPublisher",
    "AsyncSettledPublisher",
    "AsyncStoreBackend",
    "BatchOutcome",
    "BrokerUnavailable",
    "ChangeEvent",
    "ChangeSource",
    "ChangeStreamLost",
    "Checkpoints",
    "ConcurrencyConflict",
    "CountingMetrics",
    "Created",
    "DeadLetters",
    "Decision",
    "DispatchPolicy",
    "DispatchResult",
    "Dispatcher",
    "DispatcherConfig",
    "DocOutboxError",
    "DocumentTooLarge",
    "Emit",
    "Failed",
    "Handler",
    "Handlers",
    "ImmediateDispatcher",
    "InboxPolicy",
    "InboxSaturated",
    "InvalidAggregateId",
    "InvalidConfig",
    "InvalidHandlerResult",
    "InvalidInput",
    "InvalidMessage",
    "InvalidPayload",
    "LeaseKeeper",
    "LeaseTable",
    "LeaseTiming",
    "LocalPublisher",
    "LoggingMetrics",
    "MalformedDocument",
    "Message",
    "Metrics",
    "NotFound",
    "NullMetrics",
    "OutboxMessage",
    "Outcome",
    "Ownership",
    "PartitionMismatch",
    "PermanentPublishError",
    "PermanentStoreError",
    "PublishError",
    "Publisher",
    "RetryPolicy",
    "Route",
    "SettledPublisher",
    "Snapshot",
    "SoleOwner",
    "Status",
    "StoreBackend",
    "StoreConfig",
    "StoreError",
    "TransientStoreError",
    "UnknownMessageType",
    "__version__",
    "emit",
    "in_thread",
    "partition_of",
]
