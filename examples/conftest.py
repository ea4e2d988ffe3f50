"""The examples reach the same test servers as the test suite."""

from tests.conftest import mongo_uri, wire_server

__all__ = ["mongo_uri", "wire_server"]
