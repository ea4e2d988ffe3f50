"""Test doubles and contract suites that users can reuse for their own adapters."""

from docoutbox.testing.memory import AsyncMemoryBackend, MemoryBackend

__all__ = ["AsyncMemoryBackend", "MemoryBackend"]
