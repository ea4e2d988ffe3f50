"""Test doubles and contract suites that users can reuse for their own adapters.

- :mod:`docoutbox.testing.memory`: in-memory store backends;
- :mod:`docoutbox.testing.payloads`: in-memory payload stores (the claim check);
- :mod:`docoutbox.testing.payload_contract`: the payload store contract suite;
- :mod:`docoutbox.testing.publisher`: an in-memory publisher and dead letters;
- :mod:`docoutbox.testing.dispatch`: an in-memory change source, checkpoints, lease table;
- :mod:`docoutbox.testing.contract`: the store contract suite (``StoreContract``);
- :mod:`docoutbox.testing.batch_contract`: the batch-handling contract suite;
- :mod:`docoutbox.testing.dispatch_contract`: contract suites for change sources,
  checkpoints, lease tables, dead letters and publishers;
- :mod:`docoutbox.testing.blocking`: a sync store over an async one;
- :mod:`docoutbox.testing.process`: a test server run as a child process;
- :mod:`docoutbox.testing.mongo_server`: the MongoDB wire-protocol test server.
"""

from typing import TYPE_CHECKING, Any

from docoutbox.testing.memory import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.publisher import AsyncMemoryPublisher, MemoryDeadLetters, MemoryPublisher

if TYPE_CHECKING:
    from docoutbox.testing.mongo_server import MongoWireServer

__all__ = [
    "AsyncMemoryBackend",
    "AsyncMemoryPublisher",
    "MemoryBackend",
    "MemoryDeadLetters",
    "MemoryPublisher",
    "MongoWireServer",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: ``python -m docoutbox.testing.mongo_server`` would otherwise
    # find its module already imported by this package, and runpy warns about it.
    if name == "MongoWireServer":
        from docoutbox.testing.mongo_server import MongoWireServer  # noqa: PLC0415

        return MongoWireServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
