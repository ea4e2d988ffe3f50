"""The simulation can fail: with a deliberate bug in the library, it reports violations
within a few seeds, and of the invariant the bug breaks."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from tests.simulation.harness import Report, run_schedule
from tests.simulation.schedule import Variant

#: A mutation must be caught within this many seeds (in practice: the first one or two).
WITHIN = 10
#: Where the search starts for a mutation whose race only some schedules reach: a flush
#: written between two trims of one run (3 schedules of the first 600: 38, 128 and 254); a
#: deferred trim that fails while the checkpoint could pass it (6 of the first 230, from
#: 89 and 96, since a stream just opened waits the longest between its reads); a young
#: payload swept between its put and its commit, now that the sweep reads the outbox,
#: the dead letters and the outbox again before it deletes (2 of the first 120, 39 and
#: 103); a quarantined claim-checked entry trimmed at once rather than by a deferred
#: trim (10 of the first 120, from 20); a payload missing at publish time given up
#: rather than held (from 11 of the first 30).
FIRST_SEED = {
    "settled-mid-run": 38,
    "trim-failure-dropped": 89,
    "claim-sweep-young": 39,
    "claim-dead-letter-deleted": 20,
    "claim-missing-dropped": 11,
}


def first_violation(store: str, mutation: str, invariant: str, client: Any = None) -> Report:
    """The first seed whose run breaks ``invariant`` (others may break first)."""
    first = FIRST_SEED.get(mutation, 0)
    for seed in range(first, first + WITHIN):
        report = run_schedule(Variant(seed, store, mutation), client=client)
        if invariant in {v.invariant for v in report.violations}:
            return report
    pytest.fail(f"mutation {mutation} on {store} broke no {invariant} for {WITHIN} seeds")


@pytest.mark.parametrize(
    ("mutation", "invariant"),
    [
        ("inbox-off", "command-once"),  # redelivered commands apply twice
        ("consumer-window-0", "consumed-once"),  # redelivered messages apply twice
        ("version-off", "command-once"),  # stale writers overwrite each other
        ("order-off", "order"),
        ("outbox-overwrite", "published"),  # a commit drops entries it did not publish
        ("checkpoint-early", "checkpoint"),  # I5, and then entries stranded for good
        ("batch-first-state", "consumed-once"),  # a batch's commit loses applied messages
        ("inbox-oldest", "inbox-window"),  # a window of 2 overflows and drops the newest
        ("trim-first", "trimmed"),  # trimmed entries stay pending, to be published again
        ("attempts-off", "attempts"),  # stuck entries fail once more before quarantine
        ("trim-version", "trim-version"),  # a trim could fail a concurrent commit
        ("run-ahead", "order"),  # an entry refused mid-run, a later one accepted first
        ("round-misattributed", "published"),  # a refused entry taken for confirmed
        ("finished-before-over", "checkpoint"),  # I5: a run reported done unpublished
        ("due-early", "scheduled-early"),
        ("trim-not-due", "published"),  # an entry not due yet trimmed: lost
        ("hint-off", "published"),  # passed by the stream, never found once due: lost
        ("cancel-off", "cancelled"),
        ("release-off", "cancelled"),  # a copy read before the cancel published
        ("seq-at-emit", "seq-published"),  # a cancelled entry's seq never published
        ("release-version-off", "seq-published"),  # a commit reuses a released seq
        ("trims-unsettled", "checkpoint"),  # I5: past a change published, not yet trimmed
        ("trim-failure-dropped", "checkpoint"),  # a failed deferred trim forgotten
        ("trim-delay-off", "liveness"),  # a deferred trim waits for company forever
        ("untrimmed-unbounded", "untrimmed-bound"),
        ("settled-mid-run", "checkpoint"),  # a run's later trims still pending
        ("claim-put-skipped", "claim-unput"),  # a reference to nothing: never published
        ("claim-refresh-off", "claim-unput"),  # a slow put swept before its commit
        ("claim-unresolved", "claim-resolved"),  # the reference published, not the payload
        ("claim-missing-dropped", "claim-quarantined-unread"),  # the payload given up
        ("claim-delete-deferred", "claim-deleted-early"),  # deleted before the trim
        ("claim-sweep-referenced", "claim-swept-referenced"),
        ("claim-sweep-young", "published"),  # a payload swept under an in-flight commit
        ("claim-dead-letter-inline", "claim-quarantined-inline"),
        ("claim-dead-letter-deleted", "claim-deleted-early"),  # its dead letter refers to it
        ("claim-sweep-dead-letters-off", "claim-swept-referenced"),
        ("spill-after-commit", "inbox-spill"),  # IDs leave the inbox before the archive
        ("spill-lookup-off", "consumed-once"),  # a spilled ID's redelivery applies again
        ("spill-evicts", "consumed-once"),  # spilled IDs forgotten: applied again
    ],
)
def test_mutation_is_caught_in_memory(mutation: str, invariant: str) -> None:
    report = first_violation("memory", mutation, invariant)
    assert run_schedule(Variant(report.variant.seed)).ok  # the patch is undone


@pytest.mark.wire
@pytest.mark.parametrize(
    ("mutation", "invariant"),
    [("version-off", "command-once"), ("inbox-off", "consumed-once")],
)
def test_mutation_is_caught_on_the_wire_server(
    mongo_uri: str, mutation: str, invariant: str
) -> None:
    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    try:
        report = first_violation("wire", mutation, invariant, client)
        assert run_schedule(Variant(report.variant.seed, "wire"), client=client).ok
    finally:
        client.close()
