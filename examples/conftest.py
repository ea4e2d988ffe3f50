"""The examples reach the same test servers as the test suite."""

from tests.conftest import cosmos_server, mongo_uri, wire_server

__all__ = ["cosmos_server", "mongo_uri", "wire_server"]
