"""Every raw document of a store's collection, to prove a rejected call wrote nothing."""

from __future__ import annotations

import copy
from typing import Any


def raw_documents(store: Any) -> dict[Any, Any]:
    """The documents of ``store``'s collection by ``_id``, as the database holds them.

    Works for the sync stores of the test matrix (memory, mongomock, wire server).
    """
    backend = store.backend
    docs = getattr(backend, "docs", None)
    if docs is not None:
        return copy.deepcopy(dict(docs))
    return {doc["_id"]: doc for doc in backend.collection.find({})}
