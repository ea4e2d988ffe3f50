"""Whether a missing server skips a test or fails the run.

With ``DOCOUTBOX_REQUIRE_SERVERS=1`` or any truthy ``CI`` (``true``, ``1``, ``yes``...) a
missing server fails the run; otherwise the test is skipped with the reason.
"""

from __future__ import annotations

import os

import pytest


def truthy(value: str | None) -> bool:
    """How CI systems spell "on": anything but empty, 0, false, no or off."""
    return (value or "").strip().lower() not in {"", "0", "false", "no", "off"}


REQUIRE_SERVERS = truthy(os.environ.get("DOCOUTBOX_REQUIRE_SERVERS")) or truthy(
    os.environ.get("CI")
)


def missing(reason: str) -> None:
    """Skip a test that needs an absent server; fail instead when servers are required."""
    if REQUIRE_SERVERS:
        pytest.fail(f"required server missing: {reason}", pytrace=False)
    pytest.skip(reason)
