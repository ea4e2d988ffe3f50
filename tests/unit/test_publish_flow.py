"""The pure per-document dispatch flow, driven by hand."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox.dispatch.engine.flow import DispatchPolicy, Publish, Quarantine
from docoutbox.errors import (
    BrokerUnavailable,
    InvalidConfig,
    PermanentPublishError,
    PublishError,
)
from docoutbox.model import OutboxMessage
from docoutbox.store.core import Sleep, Write
from docoutbox.store.plans import FailurePlan, TrimPlan
from tests.support.dispatch_flow import document_run, entry


def drive(doc: dict[str, Any], policy: DispatchPolicy, fail: dict[str, list[Exception]]) -> Any:
    """Run the flow; ``fail[entry_id]`` lists errors its next publishes raise."""

    def publish(sent: OutboxMessage) -> None:
        if fail.get(sent.id):
            raise fail[sent.id].pop(0)

    return document_run(doc, policy, publish=publish)


def published(ops: list[Any]) -> list[int]:
    return [op.entry.seq for op in ops if isinstance(op, Publish)]


def test_publishes_in_seq_order_then_trims_once() -> None:
    doc = {"_id": "a", "outbox": [entry(3), entry(1), entry(2)]}
    ops, result = drive(doc, DispatchPolicy(), {})
    assert published(ops) == [1, 2, 3]
    assert ops[-1] == Write(TrimPlan("a", ("e1", "e2", "e3")))
    assert result.trimmed and result.published == ["e1", "e2", "e3"]


def test_a_plain_run_makes_no_list_it_does_not_fill() -> None:
    # A run holds its result until it ends: the lists of outcomes it never has (held,
    # quarantined, ...) are not made, so runs in flight give the collector less to scan.
    _, result = drive({"_id": "a", "outbox": [entry(1), entry(2)]}, DispatchPolicy(), {})
    assert result.trimmed and result.published == ["e1", "e2"]
    assert result.lists == {} and not result.unavailable
    assert result.count("held") == result.count("quarantined") == 0 and result.lists == {}
    assert result.quarantined == [] and result.removed() == ["e1", "e2"]


def test_large_backlogs_are_trimmed_in_batches() -> None:
    doc = {"_id": "a", "outbox": [entry(i) for i in range(1, 8)]}
    ops, _ = drive(doc, DispatchPolicy(trim_every=3), {})
    trims = [op.plan.entry_ids for op in ops if isinstance(op, Write)]
    assert trims == [("e1", "e2", "e3"), ("e4", "e5", "e6"), ("e7",)]
    # Each trim follows the publishes it covers.
    assert ops.index(Write(TrimPlan("a", ("e1", "e2", "e3")))) == 3


def test_retries_with_backoff_then_quarantines_and_keeps_going() -> None:
    doc = {"_id": "a", "outbox": [entry(1), entry(2)]}
    fail: dict[str, list[Exception]] = {"e1": [PublishError("nack")] * 3}
    ops, result = drive(doc, DispatchPolicy(max_attempts=3), fail)
    assert sum(isinstance(op, Sleep) for op in ops) == 2
    quarantines = [op for op in ops if isinstance(op, Quarantine)]
    assert [(q.entry["id"], q.attempts) for q in quarantines] == [("e1", 3)]
    assert "nack" in quarantines[0].error
    assert result.published == ["e2"] and result.quarantined == ["e1"]
    assert ops[-1] == Write(TrimPlan("a", ("e1", "e2")))
    # The dead letter is written before the entry is trimmed.
    assert ops.index(quarantines[0]) < len(ops) - 1


def test_permanent_refusal_quarantines_at_once() -> None:
    doc = {"_id": "a", "outbox": [entry(1)]}
    ops, result = drive(doc, DispatchPolicy(), {"e1": [PermanentPublishError("too big")]})
    assert [type(op) for op in ops] == [Publish, Quarantine, Write]
    assert result.quarantined == ["e1"]


def test_broker_outage_holds_the_rest_in_order() -> None:
    doc = {"_id": "a", "outbox": [entry(1), entry(2), entry(3)]}
    ops, result = drive(doc, DispatchPolicy(), {"e2": [BrokerUnavailable("down")]})
    assert published(ops) == [1, 2]  # e3 is never published ahead of e2
    assert result.unavailable and result.held == ["e2", "e3"]
    assert ops[-1] == Write(TrimPlan("a", ("e1",)))
    assert not any(isinstance(op, Quarantine) for op in ops)


@pytest.mark.parametrize("bad", [{"id": "x", "seq": 1}, {"seq": 2, "type": "T"}, "junk"])
def test_malformed_entries_are_quarantined_and_the_rest_flow(bad: Any) -> None:
    doc = {"_id": "a", "outbox": [bad, entry(5)]}
    ops, result = drive(doc, DispatchPolicy(), {})
    quarantines = [op for op in ops if isinstance(op, Quarantine)]
    assert len(quarantines) == 1 and "malformed" in quarantines[0].error
    assert result.published == ["e5"]


def test_failed_attempts_are_recorded_and_survive_a_restart() -> None:
    doc = {"_id": "a", "outbox": [entry(1)]}
    ops, _ = drive(doc, DispatchPolicy(max_attempts=5), {"e1": [PublishError("nack")] * 2})
    records = [op.plan for op in ops if isinstance(op, Write) and isinstance(op.plan, FailurePlan)]
    assert [(r.entry_id, r.attempts) for r in records] == [("e1", 1), ("e1", 2)]
    assert "nack" in records[0].last_error
    # After a restart the stored count goes on: one more failure reaches max_attempts.
    doc = {"_id": "a", "outbox": [entry(1, attempts=4, last_error="PublishError: nack")]}
    ops, result = drive(doc, DispatchPolicy(max_attempts=5), {"e1": [PublishError("nack")]})
    assert [type(op) for op in ops] == [Publish, Quarantine, Write]
    assert ops[1].attempts == 5
    assert result.quarantined == ["e1"]


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_attempts": 2.5},
        {"max_attempts": "3"},
        {"trim_every": 0},
        {"trim_every": 2**31},
        {"base_delay": float("nan")},
        {"max_delay": -1.0},
        {"max_delay": float("inf")},
    ],
)
def test_a_policy_it_cannot_follow_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfig, match="DispatchPolicy"):
        DispatchPolicy(**options)
