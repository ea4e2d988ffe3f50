"""The batch contract, over every adapter in the matrix of tests/conftest.py."""

from docoutbox.testing.batch_contract import BatchContract


class TestBatchContract(BatchContract):
    pass
