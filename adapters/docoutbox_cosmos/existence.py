"""Whether a container and its database exist, asked once, sync and async.

Rule: a 404 that may mean "no such container" is never taken for "no such item" (which
would make a create look like a race, or a store look healthy) until the container was
seen to exist; a missing one raises :class:`~docoutbox_cosmos.errors.ContainerNotFound`
naming the database or the container. The checks read the container, then, only when
that is missing, the database, to say which of the two is.
"""

from __future__ import annotations

from typing import Any

from azure.cosmos import DatabaseProxy
from azure.cosmos import exceptions as cosmos_errors
from azure.cosmos.aio import DatabaseProxy as AsyncDatabaseProxy

from docoutbox_cosmos.errors import DRIVER_ERRORS, NOT_FOUND, ContainerNotFound, translate


def names(container: Any) -> tuple[str, str]:
    """(database, container) of a ``ContainerProxy``, sync or aio
    (its link is ``dbs/<database>/colls/<container>``)."""
    parts = str(container.container_link).split("/")
    return parts[1], parts[3]


def _database(container: Any, aio: bool) -> Any:
    if aio:
        return AsyncDatabaseProxy(container.client_connection, names(container)[0])
    return DatabaseProxy(container.client_connection, names(container)[0])


def _missing(exc: BaseException) -> bool:
    return isinstance(exc, cosmos_errors.CosmosHttpResponseError) and exc.status_code == NOT_FOUND


def require_container(container: Any) -> None:
    """Return when ``container`` exists; else ContainerNotFound (naming the database when
    that is what is missing), or the translated error of the check."""
    database, name = names(container)
    try:
        container.read()
        return
    except DRIVER_ERRORS as exc:
        if not _missing(exc):
            raise translate(exc) from exc
        missing: BaseException = exc
    try:
        _database(container, aio=False).read()
    except DRIVER_ERRORS as exc:
        if not _missing(exc):
            raise translate(exc) from exc
        raise ContainerNotFound(database, None) from exc
    raise ContainerNotFound(database, name) from missing


async def require_container_async(container: Any) -> None:
    """:func:`require_container` for an ``azure.cosmos.aio`` container."""
    database, name = names(container)
    try:
        await container.read()
        return
    except DRIVER_ERRORS as exc:
        if not _missing(exc):
            raise translate(exc) from exc
        missing: BaseException = exc
    try:
        await _database(container, aio=True).read()
    except DRIVER_ERRORS as exc:
        if not _missing(exc):
            raise translate(exc) from exc
        raise ContainerNotFound(database, None) from exc
    raise ContainerNotFound(database, name) from missing
