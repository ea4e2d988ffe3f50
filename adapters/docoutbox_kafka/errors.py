"""The one place where confluent-kafka errors become docoutbox errors, by ``KafkaError`` code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from docoutbox.errors import BrokerUnavailable, DocOutboxError, PermanentPublishError, PublishError

#: Codes for a record the cluster will never accept as it is (too large, malformed).
PERMANENT_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError._INVALID_ARG,
    }
)
#: Codes that blame the topology, the account or the connection, not the record: the
#: entry stays pending (as when the broker is down) until the cluster is reachable and the
#: topic exists. ``_MSG_TIMED_OUT`` is a record that could not be delivered within
#: ``message.timeout.ms``, for example because no broker answered.
UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._FATAL,
        KafkaError._QUEUE_FULL,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


def translate_error(error: KafkaError, what: str) -> DocOutboxError:
    """The docoutbox error for a ``KafkaError`` met while doing ``what``."""
    code = error.code()
    detail = f"{what}: {error.name()} ({code}): {error.str()}"
    if error.fatal() or code in UNAVAILABLE_CODES:
        return BrokerUnavailable(detail)
    if code in PERMANENT_CODES:
        return PermanentPublishError(detail)
    return PublishError(detail)


def translate(exc: BaseException, what: str) -> DocOutboxError:
    """The docoutbox error for an exception raised by confluent-kafka while doing ``what``."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return translate_error(exc.args[0], what)
    if isinstance(exc, BufferError):
        return BrokerUnavailable(f"{what}: the producer's local queue is full: {exc}")
    return PublishError(f"{what}: {type(exc).__name__}: {exc}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise confluent-kafka errors as docoutbox's publish errors."""
    try:
        yield
    except (KafkaException, BufferError) as exc:
        raise translate(exc, what) from exc
