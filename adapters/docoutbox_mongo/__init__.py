"""MongoDB adapter for docoutbox: pymongo sync, AsyncMongoClient and Motor async.

- :mod:`docoutbox_mongo.backend`: the store backends (:class:`MongoBackend`,
  :class:`AsyncMongoBackend`);
- :mod:`docoutbox_mongo.plans`: write plans as MongoDB updates;
- :mod:`docoutbox_mongo.archive`: the inbox archive of a spilling inbox;
- :mod:`docoutbox_mongo.changes`: change streams as change sources;
- :mod:`docoutbox_mongo.coordination`: checkpoints, leases and dead letters;
- :mod:`docoutbox_mongo.kit`: the kit (:func:`open_kit`, :func:`open_async_kit`) and the
  ``docoutbox.stores`` adapter;
- :mod:`docoutbox_mongo.payloads`: the claim check's payload store (a side collection
  of chunks);
- :mod:`docoutbox_mongo.admin`: backlog figures, dead letters and lease rows for the
  operator commands;
- :mod:`docoutbox_mongo.errors`: the one translation of driver errors.
"""

from docoutbox_mongo.backend import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.kit import AsyncMongoKit, MongoKit, open_async_kit, open_kit

__all__ = [
    "AsyncMongoBackend",
    "AsyncMongoKit",
    "MongoBackend",
    "MongoKit",
    "open_async_kit",
    "open_kit",
]
