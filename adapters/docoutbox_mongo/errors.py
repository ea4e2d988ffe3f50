"""The one place where pymongo errors become docoutbox errors, by class and code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pymongo import errors as pm

from docoutbox.errors import (
    ChangeStreamLost,
    DocumentTooLarge,
    PermanentStoreError,
    TransientStoreError,
)
from docoutbox.model import AggregateId

#: Server error codes worth retrying (network, elections, throttling, write conflicts).
TRANSIENT_CODES = frozenset(
    {6, 7, 50, 89, 91, 112, 133, 189, 234, 262, 9001, 10107, 11600, 11602, 13435, 13436, 16500}
)
#: Server error codes for an object over the BSON size limit.
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})
DUPLICATE_KEY = 11000
#: Server codes meaning a change stream cannot resume from its position:
#: InvalidResumeToken, ChangeStreamFatalError, ChangeStreamHistoryLost.
STREAM_LOST_CODES = frozenset({260, 280, 286})


def is_duplicate_id(exc: pm.DuplicateKeyError) -> bool:
    """True when the duplicate key is ``_id`` (or the server does not say which key)."""
    details = exc.details or {}
    pattern = details.get("keyPattern")
    return pattern is None or set(pattern) == {"_id"}


@contextmanager
def translated(aggregate_id: AggregateId | None = None) -> Iterator[None]:
    """Re-raise pymongo errors as docoutbox's StoreError tree."""
    try:
        yield
    except pm.DocumentTooLarge as exc:
        raise DocumentTooLarge(aggregate_id) from exc
    except (pm.ConnectionFailure, pm.WTimeoutError, pm.ExecutionTimeout) as exc:
        raise TransientStoreError(f"MongoDB unavailable: {type(exc).__name__}: {exc}") from exc
    except pm.OperationFailure as exc:
        if exc.code in TOO_LARGE_CODES:
            raise DocumentTooLarge(aggregate_id) from exc
        if exc.code in TRANSIENT_CODES or exc.has_error_label("RetryableWriteError"):
            raise TransientStoreError(f"MongoDB error {exc.code}: {exc}") from exc
        raise PermanentStoreError(f"MongoDB error {exc.code}: {exc}") from exc
    except pm.PyMongoError as exc:
        raise PermanentStoreError(f"MongoDB error: {type(exc).__name__}: {exc}") from exc


@contextmanager
def translated_stream() -> Iterator[None]:
    """Like :func:`translated`, but an unresumable stream position is ChangeStreamLost.

    That is a code in :data:`STREAM_LOST_CODES`, the ``NonResumableChangeStreamError``
    label, or no code at all: mongo-java-server reports a malformed resume token as an
    ``OperationFailure`` without a code (real MongoDB always sends one).
    """
    try:
        yield
    except pm.OperationFailure as exc:
        if (
            exc.code is None
            or exc.code in STREAM_LOST_CODES
            or exc.has_error_label("NonResumableChangeStreamError")
        ):
            raise ChangeStreamLost(f"change stream cannot resume: {exc.code}: {exc}") from exc
        with translated():
            raise
    except pm.PyMongoError:
        with translated():
            raise
