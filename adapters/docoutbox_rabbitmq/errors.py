"""The one place where pika errors become docoutbox errors, by class and AMQP reply code.

The decisions by reply code (:func:`by_reply_code`, :func:`returned`) are shared with the
aio-pika adapter (:mod:`docoutbox_rabbitmq.aio`), which maps its own exception classes
onto them.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
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


#: What a socket error number means for a connection, in a few words.
_CAUSES = {
    errno.ECONNREFUSED: "connection refused",
    errno.ETIMEDOUT: "timed out",
    errno.ECONNRESET: "connection reset",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
}


def _inner(exc: BaseException) -> list[BaseException]:
    """The errors ``exc`` wraps: its arguments (pika's AMQPConnectionError), its
    ``exception`` (pika's connector errors), its cause and context."""
    found = [a for a in exc.args if isinstance(a, BaseException)]
    wrapped = getattr(exc, "exception", None)
    if isinstance(wrapped, BaseException):
        found.append(wrapped)
    found += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return found


def connection_cause(exc: BaseException) -> str:
    """Why a connection failed, in one line: the first socket error found in ``exc`` and
    the errors it wraps (refused, timed out, reset, unreachable, a host name not
    resolved, TLS refused with its reason), else the error's own text (pika and aiormq
    often give none)."""
    todo, seen = [exc], set()
    while todo:
        error = todo.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, socket.gaierror):
            return f"host name not resolved ({error.strerror})"
        if isinstance(error, TimeoutError):
            return "timed out"
        if isinstance(error, ssl.SSLError):  # an OSError whose errno says nothing
            detail = getattr(error, "verify_message", None) or error.reason or str(error)
            return f"TLS failed ({detail})"
        if isinstance(error, OSError) and isinstance(error.errno, int) and error.errno > 0:
            return _CAUSES.get(error.errno) or os.strerror(error.errno).lower()
        todo += _inner(error)
    text = " ".join(str(exc).split())
    return text or "no reason given"


def connection_failed(exc: BaseException, what: str) -> BrokerUnavailable:
    """The error for a connection that could not be made or was lost while doing ``what``
    (which names the broker's masked URL): one line with the cause."""
    return BrokerUnavailable(
        f"{what}: connection failed: {connection_cause(exc)} ({type(exc).__name__})"
    )


def by_reply_code(code: int, text: str, what: str) -> DocOutboxError:
    """The docoutbox error for a channel the broker closed with ``code``."""
    detail = f"{what}: channel closed by the broker ({code} {text})"
    if code in PERMANENT_CODES:
        return PermanentPublishError(detail)
    if code in MISSING_CODES:
        return PermanentPublishError(f"{detail}: a configuration error (missing exchange)")
    if code in TOPOLOGY_CODES:
        return BrokerUnavailable(detail)
    return PublishError(detail)


def returned(codes: list[int], what: str) -> PublishError:
    """The error for a message the broker returned (Basic.Return) with ``codes``."""
    return PublishError(
        f"{what}: returned by the broker as unroutable, no queue is bound for this "
        f"routing key (reply codes {codes})"
    )


def nacked(what: str) -> PublishError:
    return PublishError(f"{what}: the broker nacked the message")


def translate(exc: BaseException, what: str) -> DocOutboxError:
    """The docoutbox error for a pika (or socket) error raised while doing ``what``."""
    if isinstance(exc, px.UnroutableError):
        return returned(sorted({int(m.method.reply_code) for m in exc.messages}), what)
    if isinstance(exc, px.NackError):
        return nacked(what)
    if isinstance(exc, px.ChannelClosedByBroker):
        return by_reply_code(int(exc.reply_code), str(exc.reply_text), what)
    if isinstance(exc, px.ConnectionClosedByBroker):
        return BrokerUnavailable(
            f"{what}: connection closed by the broker ({exc.reply_code} {exc.reply_text})"
        )
    if isinstance(exc, CONNECTION_ERRORS):
        return connection_failed(exc, what)
    return PublishError(f"{what}: {type(exc).__name__}: {exc}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise pika and socket errors as docoutbox's publish errors."""
    try:
        yield
    except (px.AMQPError, OSError) as exc:
        raise translate(exc, what) from exc
