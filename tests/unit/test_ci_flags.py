"""CI detection and the end-of-run summary of skipped tests (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.support.required import truthy


@pytest.mark.parametrize("value", ["true", "1", "yes", "TRUE", "on", "github"])
def test_any_truthy_ci_counts(value: str) -> None:
    assert truthy(value)


@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "off", "False"])
def test_falsy_ci_does_not(value: str | None) -> None:
    assert not truthy(value)
