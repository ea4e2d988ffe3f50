"""The store contract, over every adapter in the matrix of tests/conftest.py."""

from typing import Any

import pytest

from docoutbox.testing.contract import StoreContract


def fails_on_mongomock(request: pytest.FixtureRequest, raises: type[BaseException]) -> None:
    """Expect the test to fail on mongomock with ``raises`` (a gap listed in
    tests/README.md, "mongomock"), and to pass everywhere else."""
    if str(request.node.callspec.params["make_store"]).startswith("mongomock"):
        request.applymarker(pytest.mark.xfail(raises=raises, strict=True))


class TestStoreContract(StoreContract):
    def test_a_release_compares_outbox_seq_as_a_number(
        self, store: Any, request: pytest.FixtureRequest
    ) -> None:
        # A positional update whose filter names outbox_seq beside outbox.id.
        fails_on_mongomock(request, TypeError)
        super().test_a_release_compares_outbox_seq_as_a_number(store)

    def test_a_release_refuses_a_released_or_cancelled_entry(
        self, store: Any, request: pytest.FixtureRequest
    ) -> None:
        # The same positional update, beside outbox_seq.
        fails_on_mongomock(request, TypeError)
        super().test_a_release_refuses_a_released_or_cancelled_entry(store)

    def test_only_a_released_true_is_released(
        self, store: Any, request: pytest.FixtureRequest
    ) -> None:
        # The positional release update, beside outbox_seq.
        fails_on_mongomock(request, TypeError)
        super().test_only_a_released_true_is_released(store)

    def test_commits_and_settles_compare_version_as_a_number(
        self, store: Any, request: pytest.FixtureRequest
    ) -> None:
        # Its filters compare with Python's ==, for which a stored true equals 1.
        fails_on_mongomock(request, AssertionError)
        super().test_commits_and_settles_compare_version_as_a_number(store)
