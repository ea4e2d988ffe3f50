"""The store contract, over every adapter in the matrix of tests/conftest.py."""

from typing import Any

import pytest

from docoutbox.testing.contract import StoreContract


def on_mongomock(request: pytest.FixtureRequest) -> bool:
    return str(request.node.callspec.params["make_store"]).startswith("mongomock")


class TestStoreContract(StoreContract):
    def test_a_release_compares_outbox_seq_as_a_number(
        self, store: Any, request: pytest.FixtureRequest
    ) -> None:
        if on_mongomock(request):
            # tests/README.md, "mongomock": a positional update whose filter names
            # ``outbox_seq`` beside ``outbox.id`` fails inside mongomock.
            request.applymarker(pytest.mark.xfail(raises=TypeError, strict=True))
        super().test_a_release_compares_outbox_seq_as_a_number(store)

    def test_commits_and_settles_compare_version_as_a_number(
        self, store: Any, request: pytest.FixtureRequest
    ) -> None:
        if on_mongomock(request):
            # tests/README.md, "mongomock": its filters compare with Python's ==, for
            # which a stored true equals 1.
            request.applymarker(pytest.mark.xfail(raises=AssertionError, strict=True))
        super().test_commits_and_settles_compare_version_as_a_number(store)
