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


class translated:
    """Re-raise pymongo errors as docoutbox's StoreError tree.

    A class rather than a ``@contextmanager`` generator: it wraps every database call,
    and entering a generator-based one costs several times more.
    """

    __slots__ = ("aggregate_id",)

    def __init__(self, aggregate_id: AggregateId | None = None) -> None:
        self.aggregate_id = aggregate_id

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, DRIVER_ERRORS):
            raise translate(exc, self.aggregate_id) from exc


#: What :func:`translate` turns into docoutbox errors (``except DRIVER_ERRORS`` on a hot
#: path costs less than entering :class:`translated`).
DRIVER_ERRORS = (pm.PyMongoError, pm.DocumentTooLarge)


def translate(exc: Exception, aggregate_id: AggregateId | None) -> Exception:
    """The docoutbox error for the pymongo error ``exc`` (one of :data:`DRIVER_ERRORS`)."""
    if isinstance(exc, pm.DocumentTooLarge):
        return DocumentTooLarge(aggregate_id)
    if isinstance(exc, pm.ConnectionFailure | pm.WTimeoutError | pm.ExecutionTimeout):
        return TransientStoreError(f"MongoDB unavailable: {type(exc).__name__}: {exc}")
    if isinstance(exc, pm.OperationFailure):
        if exc.code in TOO_LARGE_CODES:
            return DocumentTooLarge(aggregate_id)
        if exc.code in TRANSIENT_CODES or exc.has_error_label("RetryableWriteError"):
            return TransientStoreError(f"MongoDB error {exc.code}: {exc}")
        return PermanentStoreError(f"MongoDB error {exc.code}: {exc}")
    return PermanentStoreError(f"MongoDB error: {type(exc).__name__}: {exc}")


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
