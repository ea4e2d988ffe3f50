"""The store contract, over every adapter in the matrix of tests/conftest.py."""

from docoutbox.testing.contract import StoreContract


class TestStoreContract(StoreContract):
    pass
