"""Connect everything a dispatcher needs from one MongoDB URI (used by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

from docoutbox.errors import PermanentStoreError
from docoutbox_mongo.backend import MongoBackend
from docoutbox_mongo.changes import MongoChangeSource
from docoutbox_mongo.coordination import MongoCheckpoints, MongoDeadLetters, MongoLeaseTable
from docoutbox_mongo.errors import translated


@dataclass
class MongoDispatchTarget:
    client: Any
    backend: MongoBackend
    source: MongoChangeSource
    checkpoints: MongoCheckpoints
    leases: MongoLeaseTable
    dead_letters: MongoDeadLetters

    def close(self) -> None:
        self.client.close()


def connect_dispatch(
    uri: str,
    db: str,
    collection: str,
    *,
    timeout: float = 5.0,
    checkpoints: str = "docoutbox_checkpoints",
    leases: str = "docoutbox_leases",
    dead_letters: str = "docoutbox_dead_letters",
    group: str | None = None,
) -> MongoDispatchTarget:
    """Open a client and check the server answers within ``timeout`` seconds.

    Raises :class:`~docoutbox.errors.StoreError` for a bad URI or an unreachable server.
    """
    ms = max(1, int(timeout * 1000))
    try:
        with translated():
            client: Any = MongoClient(
                uri,
                serverSelectionTimeoutMS=ms,
                connectTimeoutMS=ms,
                uuidRepresentation="standard",
                appname="docoutbox-dispatch",
            )
    except ValueError as exc:  # pymongo reports some malformed URIs as plain ValueError
        raise PermanentStoreError(f"invalid MongoDB URI: {exc}") from exc
    try:
        with translated():
            database = client[db]
            coll = database[collection]
            database.command("ping")
        return MongoDispatchTarget(
            client=client,
            backend=MongoBackend(coll),
            source=MongoChangeSource(coll),
            checkpoints=MongoCheckpoints(database[checkpoints]),
            leases=MongoLeaseTable(database[leases], group or collection),
            dead_letters=MongoDeadLetters(database[dead_letters]),
        )
    except BaseException:
        client.close()
        raise


def connect_cli(args: Any) -> MongoDispatchTarget:
    """:func:`connect_dispatch` from the ``docoutbox dispatch`` arguments."""
    return connect_dispatch(args.mongo_uri, args.db, args.collection, timeout=args.server_timeout)
