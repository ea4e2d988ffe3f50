"""Test doubles and contract suites that users can reuse for their own adapters."""

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
