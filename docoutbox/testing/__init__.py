"""Test doubles and contract suites that users can reuse for their own adapters."""

from docoutbox.testing.memory import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.mongo_server import MongoWireServer
from docoutbox.testing.publisher import AsyncMemoryPublisher, MemoryDeadLetters, MemoryPublisher

__all__ = [
    "AsyncMemoryBackend",
    "AsyncMemoryPublisher",
    "MemoryBackend",
    "MemoryDeadLetters",
    "MemoryPublisher",
    "MongoWireServer",
]
