"""MongoDB adapter for docoutbox: pymongo sync, AsyncMongoClient and Motor async."""

from docoutbox_mongo.backend import AsyncMongoBackend, MongoBackend, bson_size
from docoutbox_mongo.changes import MongoChangeSource
from docoutbox_mongo.coordination import MongoCheckpoints, MongoDeadLetters, MongoLeaseTable
from docoutbox_mongo.wiring import MongoDispatchTarget, connect_dispatch

__all__ = [
    "AsyncMongoBackend",
    "MongoBackend",
    "MongoChangeSource",
    "MongoCheckpoints",
    "MongoDeadLetters",
    "MongoDispatchTarget",
    "MongoLeaseTable",
    "bson_size",
    "connect_dispatch",
]
