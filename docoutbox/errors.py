"""The docoutbox error tree.

Every error the library raises derives from :class:`DocOutboxError`::

    DocOutboxError
    ├── InvalidInput (also a ValueError)      rejected before anything is written
    │   ├── InvalidAggregateId
    │   ├── InvalidMessage
    │   ├── InvalidPayload
    │   ├── InvalidHandlerResult
    │   ├── UnknownMessageType
    │   ├── InvalidConfig (also a TypeError)  a configuration value of the wrong type or range
    │   └── MalformedDocument                 a stored document the core cannot read
    │       └── CorruptValue                  an encoded value fails to decode (tampered, cut)
    ├── ConcurrencyConflict                   the optimistic-concurrency guard did not match
    ├── NotFound
    ├── DocumentTooLarge                      the write would exceed the store's item limit
    ├── InboxSaturated                        exact de-duplication would exceed its bound
    ├── StoreError
    │   ├── TransientStoreError               worth retrying (network, throttling, failover)
    │   ├── PermanentStoreError               retrying will not help (auth, bad config)
    │   └── ChangeStreamLost                  the stream position cannot be resumed
    ├── PublishError                          a broker refused or did not confirm a message
    │   └── PermanentPublishError             the broker will never accept this message
    ├── BrokerUnavailable                     the broker cannot be reached: not the message's fault
    ├── CodecError                            a stored value needs what the reader lacks
    │   ├── UnknownKey                        written under a key ID the keyring does not hold
    │   └── UnknownCodec                      encoded by a codec the reader was not given
    └── PayloadMissing                        a claim-checked payload is not (wholly) stored

Adapters translate their driver's errors in exactly one place, using structured
codes, never message text.
"""

from __future__ import annotations

from collections.abc import Collection


class DocOutboxError(Exception):
    """Root of every error raised by docoutbox."""


class InvalidInput(DocOutboxError, ValueError):
    """Input was rejected before anything was written."""


class InvalidAggregateId(InvalidInput):
    """An aggregate ID must be a non-empty string or an integer."""


class InvalidMessage(InvalidInput):
    """A message is missing its ID or has malformed fields."""


class InvalidPayload(InvalidInput):
    """A payload, header or state value cannot be serialized to JSON-compatible data."""


class InvalidHandlerResult(InvalidInput):
    """A handler returned something other than a state or a Decision of the right type."""


class UnknownMessageType(InvalidInput):
    """No handler is registered for a message type."""


class InvalidConfig(InvalidInput, TypeError):
    """A configuration value (store, retry, inbox, dispatcher) has the wrong type or range."""


class MalformedDocument(InvalidInput):
    """A stored document does not have the layout docoutbox writes."""


class CorruptValue(MalformedDocument):
    """An encoded stored value does not decode: cut, altered, or not written by docoutbox.

    The dispatcher quarantines an entry that holds one (I7), as any malformed entry."""


class ConcurrencyConflict(DocOutboxError):
    """The document changed since it was read; reload and try again."""


class NotFound(DocOutboxError):
    """The aggregate does not exist."""


class DocumentTooLarge(DocOutboxError):
    """The write would make the document larger than the store accepts."""

    def __init__(
        self, aggregate_id: object, size: int | None = None, limit: int | None = None
    ) -> None:
        sizes = (
            f"the document would be {size} bytes, over the store's limit of {limit} bytes"
            if size is not None and limit is not None
            else "the database refused the document as too large"
        )
        super().__init__(f"aggregate {aggregate_id!r}: {sizes}; nothing was written")
        self.aggregate_id = aggregate_id
        self.size = size
        self.limit = limit


class InboxSaturated(DocOutboxError):
    """Exact de-duplication would keep more out-of-order sequence numbers than allowed.

    Nothing is written: advancing the watermark over unseen numbers could drop a later
    message, so the receiver must see the gap filled (or raise ``max_above``) first.
    """


class StoreError(DocOutboxError):
    """The database failed."""


class TransientStoreError(StoreError):
    """A database failure that may succeed when retried."""


class PermanentStoreError(StoreError):
    """A database failure that will not succeed when retried."""


class ChangeStreamLost(StoreError):
    """The change stream cannot resume from its position (history lost, bad token).

    The dispatcher recovers by sweeping documents with pending entries and restarting the
    stream from a fresh position; nothing is lost.

    ``partitions``, when given, says only the positions of those (ownership) partitions
    were lost and the source already restarted them from now (a Cosmos DB feed range
    that is gone): the dispatcher sweeps those partitions and keeps the stream open.
    """

    def __init__(self, *args: object, partitions: Collection[int] | None = None) -> None:
        super().__init__(*args)
        self.partitions: frozenset[int] | None = (
            None if partitions is None else frozenset(partitions)
        )


class PublishError(DocOutboxError):
    """A broker refused, returned or did not confirm a message."""


class PermanentPublishError(PublishError):
    """The broker will never accept this message; retrying cannot help."""


class BrokerUnavailable(DocOutboxError):
    """The broker cannot be reached. Entries stay pending; they do not count as failing."""


class PartitionMismatch(DocOutboxError):
    """The dispatcher's partition count differs from the one the stores wrote with.

    Leased dispatchers would strand every aggregate of a partition no instance owns.
    """


class CodecError(DocOutboxError):
    """A stored value was encoded with something this reader was not given.

    A configuration problem, not the data's: nothing is quarantined for it; the reader
    stops with this error until it is given the codec or key."""


class UnknownKey(CodecError):
    """An encrypted value names a key ID the keyring does not hold."""


class UnknownCodec(CodecError):
    """An encoded value names a codec the reader was not given."""


class PayloadMissing(DocOutboxError):
    """A claim-checked entry's payload is not in the payload store (or only in part).

    The entry is neither published nor trimmed: it stays pending and is tried again."""
