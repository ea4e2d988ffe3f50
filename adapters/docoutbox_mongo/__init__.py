"""MongoDB adapter for docoutbox: pymongo sync, AsyncMongoClient and Motor async."""

from docoutbox_mongo.backend import AsyncMongoBackend, MongoBackend, bson_size
from docoutbox_mongo.changes import AsyncMongoChangeSource, MongoChangeSource
from docoutbox_mongo.coordination import (
    AsyncMongoCheckpoints,
    AsyncMongoDeadLetters,
    MongoCheckpoints,
    MongoDeadLetters,
    MongoLeaseTable,
)
from docoutbox_mongo.wiring import (
    AsyncMongoDispatchTarget,
    MongoDispatchTarget,
    connect_dispatch,
    connect_dispatch_async,
)

__all__ = [
    "AsyncMongoBackend",
    "AsyncMongoChangeSource",
    "AsyncMongoCheckpoints",
    "AsyncMongoDeadLetters",
    "AsyncMongoDispatchTarget",
    "MongoBackend",
    "MongoChangeSource",
    "MongoCheckpoints",
    "MongoDeadLetters",
    "MongoDispatchTarget",
    "MongoLeaseTable",
    "bson_size",
    "connect_dispatch",
    "connect_dispatch_async",
]
