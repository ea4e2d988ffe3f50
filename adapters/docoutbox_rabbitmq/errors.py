"""The one place where pika errors become docoutbox errors, by class and AMQP reply code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pika.exceptions as px  # type: ignore[import-untyped, unused-ignore]

from docoutbox.errors import BrokerUnavailable, DocOutboxError, PermanentPublishError, PublishError

#: Channel reply codes for a message the broker will never accept as it is:
#: 311 CONTENT_TOO_LARGE, 406 PRECONDITION_FAILED (RabbitMQ: over ``max_message_size``,
#: a malformed ``expiration``, a ``user_id`` that is not the connection's user).
PERMANENT_CODES = frozenset({311, 406})
#: Channel reply codes that blame the account or a lock, not the message:
#: 403 ACCESS_REFUSED, 405 RESOURCE_LOCKED. Entries stay pending (as when the broker is
#: down) until an operator fixes it.
TOPOLOGY_CODES = frozenset({403, 405})
#: 404 NOT_FOUND: the exchange does not exist. A configuration error that retrying cannot
#: fix: permanent (the entry is quarantined with the error). ``docoutbox dispatch`` checks
#: the exchange at start-up and refuses to start without it.
MISSING_CODES = frozenset({404})
#: Basic.Return reply codes: 312 NO_ROUTE, 313 NO_CONSUMERS.
RETURN_CODES = frozenset({312, 313})

#: Errors that mean the connection (or its socket) is gone or unusable.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    px.AMQPConnectionError,
    px.ConnectionWrongStateError,
    px.ChannelWrongStateError,
    px.ChannelClosedByClient,
    px.ConsumerCancelled,
    OSError,
)


def translate(exc: BaseException, what: str) -> DocOutboxError:
    """The docoutbox error for a pika (or socket) error raised while doing ``what``."""
    if isinstance(exc, px.UnroutableError):
        codes = sorted({int(m.method.reply_code) for m in exc.messages})
        return PublishError(
            f"{what}: returned by the broker as unroutable, no queue is bound for this "
            f"routing key (reply codes {codes})"
        )
    if isinstance(exc, px.NackError):
        return PublishError(f"{what}: the broker nacked the message")
    if isinstance(exc, px.ChannelClosedByBroker):
        code = int(exc.reply_code)
        detail = f"{what}: channel closed by the broker ({code} {exc.reply_text})"
        if code in PERMANENT_CODES:
            return PermanentPublishError(detail)
        if code in MISSING_CODES:
            return PermanentPublishError(f"{detail}: a configuration error (missing exchange)")
        if code in TOPOLOGY_CODES:
            return BrokerUnavailable(detail)
        return PublishError(detail)
    if isinstance(exc, px.ConnectionClosedByBroker):
        return BrokerUnavailable(
            f"{what}: connection closed by the broker ({exc.reply_code} {exc.reply_text})"
        )
    if isinstance(exc, CONNECTION_ERRORS):
        return BrokerUnavailable(f"{what}: connection failed: {type(exc).__name__}: {exc}")
    return PublishError(f"{what}: {type(exc).__name__}: {exc}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise pika and socket errors as docoutbox's publish errors."""
    try:
        yield
    except (px.AMQPError, OSError) as exc:
        raise translate(exc, what) from exc
