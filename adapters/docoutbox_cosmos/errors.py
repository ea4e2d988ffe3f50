"""The one place where azure-cosmos errors become docoutbox errors, by status code.

=========================  ===========================================================
404 Not Found              expected by reads and conditional writes: "not applied";
                           but :class:`ContainerNotFound` when the database or the
                           container is what is missing (see below)
409 Conflict               expected by creates: "already exists"
412 Precondition Failed    expected by conditional writes: "condition did not hold"
413 Entity Too Large       :class:`~docoutbox.errors.DocumentTooLarge`
429 Too Many Requests      retried after ``x-ms-retry-after-ms``, then
                           :class:`Throttled` (a TransientStoreError)
449 Retry With             retried, then TransientStoreError
408, 410, 500, 503         TransientStoreError
timeouts, connection       TransientStoreError
400, 401, 403, other       PermanentStoreError
=========================  ===========================================================

A 404 names a missing item or a missing database/container. It is the container's
(:func:`owner_missing`) when its sub-status is 1003 (owner resource not found, as
Cosmos DB answers an item request in a missing container or database), or when the
request targeted the container itself (a create, a query, a read of the container):
no item can be missing there. Any other 404 of an item request is the item's, once the
container is known to exist (:mod:`docoutbox_cosmos.existence` checks it).

A change-feed continuation the service refuses (400 on a feed read, or a token that is
not ours) is :class:`~docoutbox.errors.ChangeStreamLost`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager

from azure.core import exceptions as core_errors
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.errors import (
    ChangeStreamLost,
    DocumentTooLarge,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)

NOT_FOUND, CONFLICT, PRECONDITION_FAILED, TOO_LARGE = 404, 409, 412, 413
#: The sub-status of a 404 whose owner (container or database) does not exist.
OWNER_RESOURCE_NOT_FOUND = 1003
THROTTLED, RETRY_WITH = 429, 449
TRANSIENT_STATUSES = frozenset({408, 410, 429, 449, 500, 502, 503, 504})
#: How many times a throttled (429) or retry-with (449) request is sent again.
THROTTLE_RETRIES = 5
#: The wait before resending a 449, or a 429 without a retry-after header, in seconds.
DEFAULT_RETRY_AFTER = 0.05


class Throttled(TransientStoreError):
    """Cosmos DB kept answering 429; ``retry_after`` is its last requested wait (seconds)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ContainerNotFound(PermanentStoreError):
    """The database, or the container in it, does not exist. docoutbox never creates an
    aggregates' container (its partition key and throughput are the owner's choice):
    create it first. ``container`` is None when the database itself is missing."""

    def __init__(self, database: str, container: str | None) -> None:
        if container is None:
            text = f"Cosmos DB database {database!r} does not exist"
        else:
            text = f"Cosmos DB container {container!r} does not exist in database {database!r}"
        super().__init__(f"{text}: create it first")
        self.database = database
        self.container = container


def owner_missing(exc: BaseException, container_request: bool) -> bool | None:
    """Whether ``exc`` says the container or its database is missing: True (sub-status
    1003, or any 404 of a ``container_request``: a create, a query or a read of the
    container), False (not a 404), or None (a 404 of an item request that may be the
    item's: check the container)."""
    if not isinstance(exc, cosmos_errors.CosmosHttpResponseError) or exc.status_code != NOT_FOUND:
        return False
    if container_request or exc.sub_status == OWNER_RESOURCE_NOT_FOUND:
        return True
    return None


class Refusal(enum.Enum):
    """An expected answer to a conditional request: the plan did not apply."""

    MISSING = NOT_FOUND
    EXISTS = CONFLICT
    STALE = PRECONDITION_FAILED


def refusal(exc: BaseException) -> Refusal | None:
    """The expected refusal ``exc`` stands for (404, 409, 412), else None."""
    if isinstance(exc, cosmos_errors.CosmosHttpResponseError):
        for kind in Refusal:
            if exc.status_code == kind.value:
                return kind
    return None


def retry_after(exc: BaseException, attempt: int) -> float | None:
    """Seconds to wait before resending a request that got ``exc``, or None: do not."""
    if not isinstance(exc, cosmos_errors.CosmosHttpResponseError):
        return None
    if exc.status_code not in (THROTTLED, RETRY_WITH) or attempt >= THROTTLE_RETRIES:
        return None
    header = (exc.headers or {}).get("x-ms-retry-after-ms")
    try:
        return float(header) / 1000.0 if header is not None else DEFAULT_RETRY_AFTER
    except ValueError:
        return DEFAULT_RETRY_AFTER


def translate(exc: BaseException, aggregate_id: object = None) -> StoreError | DocumentTooLarge:
    """The docoutbox error for an azure-cosmos / azure-core error."""
    if isinstance(exc, cosmos_errors.CosmosHttpResponseError):
        status, sub = exc.status_code, exc.sub_status
        text = f"Cosmos DB status {status}" + (f"/{sub}" if sub else "")
        if status == TOO_LARGE:
            return DocumentTooLarge(aggregate_id)
        if status == THROTTLED:
            wait = retry_after(exc, 0)
            return Throttled(f"{text}: throttled", wait or DEFAULT_RETRY_AFTER)
        if status in TRANSIENT_STATUSES:
            return TransientStoreError(f"{text}: {exc.http_error_message}")
        return PermanentStoreError(f"{text}: {exc.http_error_message}")
    if isinstance(
        exc,
        cosmos_errors.CosmosClientTimeoutError
        | core_errors.ServiceRequestError
        | core_errors.ServiceResponseError,
    ):
        return TransientStoreError(f"Cosmos DB unavailable: {type(exc).__name__}: {exc}")
    return PermanentStoreError(f"Cosmos DB error: {type(exc).__name__}: {exc}")


#: What a driver catches and hands to :func:`translate`.
DRIVER_ERRORS = (core_errors.AzureError,)


@contextmanager
def translated(aggregate_id: object = None) -> Iterator[None]:
    """Re-raise azure errors as docoutbox's StoreError tree."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate(exc, aggregate_id) from exc


@contextmanager
def translated_feed() -> Iterator[None]:
    """Like :func:`translated`, but a refused continuation is ChangeStreamLost."""
    try:
        yield
    except cosmos_errors.CosmosHttpResponseError as exc:
        if exc.status_code in (400, 410):  # a refused token; a range gone (SDK gave up)
            raise ChangeStreamLost(f"change feed cannot resume: {exc.status_code}") from exc
        raise translate(exc) from exc
    except DRIVER_ERRORS as exc:
        raise translate(exc) from exc
