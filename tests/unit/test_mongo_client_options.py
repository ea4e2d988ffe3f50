"""The MongoDB URI's own options are kept: pymongo lets keyword options override the URI's,
so the wiring passes only what the caller asked for or the URI leaves unset. Before, a
URI's ``serverSelectionTimeoutMS``, ``connectTimeoutMS`` and ``appName`` were silently
replaced by 5 s and "docoutbox"."""

from __future__ import annotations

import pytest

from docoutbox_mongo.kit import client_options

UNREACHABLE = "mongodb://127.0.0.1:1/"


def test_without_uri_options_the_defaults_apply() -> None:
    assert client_options(UNREACHABLE, None, "app") == {
        "uuidRepresentation": "standard",
        "serverSelectionTimeoutMS": 5000,
        "connectTimeoutMS": 5000,
        "appname": "app",
    }


@pytest.mark.parametrize(
    "query",
    [
        "?serverSelectionTimeoutMS=700&connectTimeoutMS=900&appName=orders",
        "?SERVERSELECTIONTIMEOUTMS=700;connecttimeoutms=900;appname=orders",
    ],
)
def test_the_uri_options_are_kept_whatever_their_case_or_separator(query: str) -> None:
    assert client_options(UNREACHABLE + query, None, "app") == {"uuidRepresentation": "standard"}


def test_only_the_options_the_uri_leaves_unset_are_passed() -> None:
    options = client_options(UNREACHABLE + "?directConnection=true&appName=orders", None, "app")
    assert options["serverSelectionTimeoutMS"] == options["connectTimeoutMS"] == 5000
    assert "appname" not in options


def test_a_timeout_asked_for_wins_over_the_uri() -> None:
    options = client_options(UNREACHABLE + "?serverSelectionTimeoutMS=700", 0.25, "app")
    assert options["serverSelectionTimeoutMS"] == options["connectTimeoutMS"] == 250
