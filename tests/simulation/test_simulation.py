"""Exactly-once under faults: many seeded schedules, each checked against every invariant.

``DOCOUTBOX_SIM_SCHEDULES`` sets how many in-memory schedules run (default 500; CI runs
10,000), ``DOCOUTBOX_SIM_SEED`` the first seed (default 0), and
``DOCOUTBOX_SIM_WIRE_SCHEDULES`` how many run on the MongoDB wire server (default 100),
``DOCOUTBOX_SIM_COSMOS_SCHEDULES`` how many on Cosmos DB (default 100).
A failure prints the command that replays it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox.model import OutboxMessage
from tests.simulation.actors import Command, Producer, Sink
from tests.simulation.harness import Report, run_schedule
from tests.simulation.invariants import Record, check, publish_order, seq_published
from tests.simulation.schedule import CLAIM_FAULTS, FAULTS, Variant
from tests.support.cosmos import scratch_database

SCHEDULES = int(os.environ.get("DOCOUTBOX_SIM_SCHEDULES", "500"))
FIRST_SEED = int(os.environ.get("DOCOUTBOX_SIM_SEED", "0"))
WIRE_SCHEDULES = int(os.environ.get("DOCOUTBOX_SIM_WIRE_SCHEDULES", "100"))
COSMOS_SCHEDULES = int(os.environ.get("DOCOUTBOX_SIM_COSMOS_SCHEDULES", "100"))
CHUNK = 500


def chunks(first: int, count: int) -> list[range]:
    return [range(s, min(s + CHUNK, first + count)) for s in range(first, first + count, CHUNK)]


def failures(reports: Iterator[Report]) -> str:
    bad = [report for report in reports if not report.ok]
    shown = "\n".join(report.describe() for report in bad[:5])
    return f"{len(bad)} failing schedule(s)\n{shown}" if bad else ""


@pytest.mark.parametrize("seeds", chunks(FIRST_SEED, SCHEDULES), ids=lambda r: f"{r.start}-{r[-1]}")
def test_exactly_once_under_faults_in_memory(seeds: range) -> None:
    problems = failures(run_schedule(Variant(seed)) for seed in seeds)
    assert not problems, problems


@pytest.mark.wire
def test_exactly_once_under_faults_on_the_wire_server(mongo_uri: str) -> None:
    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    try:
        reports = (
            run_schedule(Variant(seed, "wire"), client=client) for seed in range(WIRE_SCHEDULES)
        )
        problems = failures(reports)
    finally:
        client.close()
    assert not problems, problems


@pytest.mark.cosmos
def test_exactly_once_under_faults_on_cosmos(cosmos_server: Any) -> None:
    with scratch_database(cosmos_server) as database:
        reports = (
            run_schedule(Variant(seed, "cosmos"), client=database)
            for seed in range(COSMOS_SCHEDULES)
        )
        problems = failures(reports)
    assert not problems, problems


#: Events that prove the schedules reach the paths they are meant to: every fault, a
#: crash at each step boundary that matters, conflicts, duplicates, give-ups, quarantines,
#: broker outages, checkpoint recovery and redeliveries.
MUST_HAPPEN = [
    *(f"fault.{kind}" for kind in FAULTS),
    "crash.Write.CommitPlan",  # the handler ran, the commit did not happen
    "crash.Ack",  # committed, not acknowledged: redelivered
    "crash.Publish",
    "dispatch.round.3",  # three or more aggregates' entries in flight at once
    "scheduled.stored",
    "scheduled.cancelled",
    "write.ReleasePlan.refused",  # a cancel won against the release of a due entry
    "write.SettlePlan.refused",  # an entry came after the run's copy
    "crash.Write.TrimPlan",  # published, not trimmed
    "crash.trims_deferred",  # published and confirmed, the deferred trim not yet written
    "dispatch.trims_flushed",  # deferred trims written behind the publishes
    "dispatch.trims_at_bound",  # the deferred trims at their bound: a run writes its own
    "write.CommitPlan.before_deferred_trim",  # a business write racing a deferred trim
    "crash.SaveCheckpoint",
    "write.CommitPlan.refused",  # a concurrent writer won
    "write.InsertPlan.refused",
    "producer.duplicate",
    "consumer.duplicate",
    "producer.gave_up",
    "producer.store_error",
    "consumer.store_error",
    "consumer.batch_failed",  # a handler failed in the middle of a batch
    "consumer.batch_size.4",
    "crash.Poll",  # a batch half received
    "quarantined",
    "dispatch.held",
    "dispatcher.fresh_start",  # no checkpoint: sweep behind a gate
    "dispatcher.replay",
    "dispatcher.store_error",
    "redelivery.after_crash",
    "deliveries.redelivered",
    "commands.redelivered",
    "checkpoint.saved",
    # The claim check: every claim fault, crashes around its puts and reads, payloads
    # deleted after their trims and swept as orphans, a payload kept by the sweep since a
    # pending entry refers to it, and one kept since it was put again.
    *(f"fault.{kind}" for kind in CLAIM_FAULTS),
    "claim.committed",
    "claim.deleted",
    "claim.swept",
    "crash.PutPayload",
    "crash.GetPayload",
    "crash.FindStale",
    "sweeper.referenced",
    "sweeper.refreshed",
]


def test_schedules_exercise_every_fault_and_path() -> None:
    """Every event happens within 1,200 schedules (the rarest, a crash at a payload's
    read, in about one of 150); the search stops at 300 once all have."""
    totals: Counter[str] = Counter()
    for seed in range(1_200):
        totals.update(run_schedule(Variant(seed)).stats)
        if seed >= 299 and all(totals[event] for event in MUST_HAPPEN):
            break
    assert [event for event in MUST_HAPPEN if not totals[event]] == []


def test_a_seed_replays_step_for_step() -> None:
    first = run_schedule(Variant(11), trace=True)
    again = run_schedule(Variant(11), trace=True)
    assert first.trace and first.trace == again.trace
    assert first.stats == again.stats
    other = run_schedule(Variant(12), trace=True)
    assert other.trace != first.trace


def test_a_seed_with_random_entry_ids_replays_its_faults() -> None:
    """Entry IDs are random UUIDs unless ``deterministic_ids``: what the world decides
    about an entry (a broker refusing it while faults last) must not depend on them, or
    a seed would not replay, and a mutation caught by one run could escape the next."""
    for seed in (57, 66, 153):  # schedules whose broker refuses entries while faults last
        schedule = Variant(seed).schedule()
        assert not schedule.deterministic_ids and schedule.stuck
        first, again = run_schedule(Variant(seed)), run_schedule(Variant(seed))
        assert first.stats["fault.stuck"] and first.stats == again.stats
    # Claim-checked: payload IDs derive from the random entry IDs; the sweep must not
    # depend on them either.
    schedule = Variant(3).schedule()
    assert schedule.claimed and not schedule.deterministic_ids
    first, again = run_schedule(Variant(3), trace=True), run_schedule(Variant(3), trace=True)
    assert first.stats["claim.committed"] and first.stats == again.stats


def test_a_failing_seed_names_its_replay_command() -> None:
    report = run_schedule(Variant(0, mutation="inbox-off"))
    assert not report.ok
    assert "replay: python -m tests.simulation --seed 0 --mutation inbox-off" in report.describe()


# -- the invariants themselves, on hand-made histories ----------------------------------


def entry(seq: int, destination: str = "c1", aggregate: str = "p1") -> dict[str, Any]:
    return {
        "id": f"{aggregate}-{seq}",
        "type": "Effect",
        "payload": {},
        "created_at": "2030-01-01T00:00:00Z",
        "seq": seq,
        "aggregate_id": aggregate,
        "aggregate_type": "Producer",
        "causation_id": f"cmd-{seq}",
        "destination": destination,
    }


def history(published: list[int], quarantined: dict[int, int] | None = None) -> Record:
    record = Record(stored=[entry(seq) for seq in (1, 2, 3)])
    record.number(record.stored)
    for seq in published:
        record.publications.append((record.tick(), OutboxMessage.parse(entry(seq))))
    for seq, event in (quarantined or {}).items():
        record.quarantined[f"p1-{seq}"] = event
    return record


def test_order_allows_a_restart_to_repeat_a_prefix() -> None:
    assert list(publish_order(history([1, 2, 1, 2, 3, 2, 3]))) == []


def test_order_flags_an_entry_first_published_before_its_predecessor() -> None:
    found = list(publish_order(history([1, 3, 2])))
    assert [v.invariant for v in found] == ["order"]
    assert "p1 seq 3" in found[0].detail


def test_order_accepts_a_predecessor_quarantined_first() -> None:
    assert list(publish_order(history([1, 3], quarantined={2: 0}))) == []
    assert list(publish_order(history([1, 3], quarantined={2: 5}))) != []


def test_check_flags_lost_duplicated_and_pending_work() -> None:
    record = history([1, 2])
    for seq in (1, 2, 3):
        msg = OutboxMessage.parse(entry(seq)).to_message()
        record.commands.append(Command("p1", msg.model_copy(update={"id": f"cmd-{seq}"}), ("c1",)))
    producer = {
        "_id": "p1",
        "outbox_seq": 3,
        "outbox": [entry(3)],
        "state": Producer(applied=["cmd-1", "cmd-2", "cmd-2"]).model_dump(),
    }
    sink = {"_id": "c1", "state": Sink(seen=["p1-1", "p1-1", "ghost"]).model_dump()}
    found = [str(v) for v in check(record, {"p1": producer}, {"c1": sink})]
    assert "[command-once] cmd-2 is applied 2 times in p1's state" in found
    assert "[command-once] cmd-3 is applied 0 times in p1's state" in found
    assert any(v.startswith("[published] p1 seq 3") for v in found)
    assert any(v.startswith("[consumed-once] p1 seq 1") and "2 times" in v for v in found)
    assert any(v.startswith("[consumed-once] p1 seq 2") and "0 times" in v for v in found)
    assert "[consumed-once] c1 processed ghost, which was never stored" in found
    assert "[drained] p1 still has pending entries [3]" in found
    assert "[seq-published] p1: published seqs [1, 2], outbox_seq 3" in found


def test_seq_published_flags_a_gap_and_a_shared_seq() -> None:
    record = history([1, 3])
    found = [str(v) for v in seq_published(record, {"p1": {"_id": "p1", "outbox_seq": 3}})]
    assert "[seq-published] p1: published seqs [1, 3], outbox_seq 3" in found
    record = history([1, 2, 3])
    twin = {**entry(2), "id": "p1-twin"}
    record.publications.append((record.tick(), OutboxMessage.parse(twin)))
    found = [str(v) for v in seq_published(record, {"p1": {"_id": "p1", "outbox_seq": 3}})]
    assert "[seq-published] p1 seq 2 was published for ['p1-2', 'p1-twin']" in found
