"""Failure fingerprints of dead letters: one group per kind of failure, whatever values
vary between occurrences; different types or reasons never share a group."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox.dispatch.tools.failures import failure_groups, failure_of, fingerprint, normalize

T0 = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


def dead(
    name: str, error: str, *, aggregate: str = "a1", minutes: int = 0, **extra: Any
) -> dict[str, Any]:
    return {
        "_id": name,
        "aggregate_id": aggregate,
        "entry": {"id": name, "aggregate_id": aggregate},
        "error": error,
        "quarantined_at": T0 + timedelta(minutes=minutes),
        **extra,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("refused at offset 1234 after 2.5 s", "refused at offset <n> after <n> s"),
        ("key 'order-17' and \"x y\" and `z`", "key <q> and <q> and <q>"),
        ("at 2026-11-27T09:30:01.123+00:00 or 2026-11-27 09:30", "at <time> or <time>"),
        ("took until 09:30:01.5", "took until <time>"),
        ("id 0192f3a1-7c2e-7d7f-9e3a-1b2c3d4e5f60 done", "id <uuid> done"),
        ("id 0192f3a17c2e7d7f9e3a1b2c3d4e5f60 done", "id <uuid> done"),
        ("channel 0x7f3a closed, token deadbeef12", "channel <hex> closed, token <hex>"),
        ("node rabbit@host-3 shard s17", "node rabbit@<id> shard <id>"),
        ("  spread \n over\tlines ", "spread over lines"),
        ("no values here", "no values here"),
    ],
)
def test_normalize_replaces_what_varies(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_the_dead_letters_own_names_are_replaced_first() -> None:
    """An entry or aggregate ID without digits would survive the patterns."""
    doc = dead(
        "entry-abc", "ValueError: entry entry-abc of order-one refused", aggregate="order-one"
    )
    assert failure_of(doc).message == "entry <entry> of <aggregate> refused"
    queued = dead("m", "a delivery: KeyError: no route to orders", queue="orders")
    assert failure_of(queued).message == "no route to <queue>"


@pytest.mark.parametrize(
    ("error", "error_type", "message"),
    [
        (
            "PermanentPublishError: entry e1: refused",
            "PermanentPublishError",
            "entry <entry>: refused",
        ),
        ("message e1: RuntimeError: tally is broken", "RuntimeError", "tally is broken"),
        ("message e1: gave up after 4 attempts", "", "gave up after <n> attempts"),
        ("malformed entry: seq missing", "", "malformed entry: seq missing"),
        (
            "pika.exceptions.UnroutableError: 1 message",
            "pika.exceptions.UnroutableError",
            "<n> message",
        ),
        ("", "", ""),
    ],
)
def test_the_error_type_is_the_leading_name(error: str, error_type: str, message: str) -> None:
    failure = failure_of(dead("e1", error))
    assert (failure.error_type, failure.message) == (error_type, message)


def test_same_failure_same_fingerprint_other_failure_other_fingerprint() -> None:
    one = dead("e1", "PermanentPublishError: entry e1: refused at offset 7", aggregate="o1")
    two = dead("e2", "PermanentPublishError: entry e2: refused at offset 9001", aggregate="o2")
    other_type = dead("e3", "PublishError: entry e3: refused at offset 7")
    other_reason = dead("e4", "PermanentPublishError: entry e4: too large at offset 7")
    assert fingerprint(one) == fingerprint(two)
    assert len({fingerprint(d) for d in (one, other_type, other_reason)}) == 3
    assert len(fingerprint(one)) == 16 and int(fingerprint(one), 16) >= 0


def test_groups_count_and_date_their_members_largest_first() -> None:
    docs = [
        dead("e1", "PermanentPublishError: entry e1: refused", minutes=5),
        dead("e2", "PermanentPublishError: entry e2: refused", minutes=1),
        dead("e3", "PermanentPublishError: entry e3: refused", minutes=9),
        dead("e4", "message e4: RuntimeError: broken", minutes=3),
        {"_id": "raw", "error": "RuntimeError: broken"},  # no time, no entry
    ]
    big, small = failure_groups(docs)
    assert (big.count, big.error_type, big.message) == (
        3,
        "PermanentPublishError",
        "entry <entry>: refused",
    )
    assert (big.first_seen, big.last_seen, big.example_id) == (
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=9),
        "e2",
    )
    assert (small.count, small.example_id, small.first_seen) == (2, "e4", T0 + timedelta(minutes=3))
    assert big.to_json()["first_seen"] == (T0 + timedelta(minutes=1)).isoformat()
    assert failure_groups([]) == []
