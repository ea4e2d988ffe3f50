"""MongoDB adapter for docoutbox: pymongo sync, AsyncMongoClient and Motor async."""

from docoutbox_mongo.backend import AsyncMongoBackend, MongoBackend, bson_size

__all__ = ["AsyncMongoBackend", "MongoBackend", "bson_size"]
