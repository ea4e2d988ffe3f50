"""Credential masking, stream positions, event targets, metrics and the scheduler."""

from __future__ import annotations

import io
import logging
import random

import pytest
from bson import Timestamp

from docoutbox.dispatch.drivers.threads import event_target
from docoutbox.dispatch.engine.checkpoint import Gate, PositionTracker
from docoutbox.dispatch.engine.scheduler import AggregateQueue, RunOutcome
from docoutbox.errors import ChangeStreamLost
from docoutbox.retry import Backoff
from docoutbox.store.document import partition_of
from docoutbox_app.logs import MaskingFilter, configure, mask, secrets_of
from docoutbox_mongo.changes import stream_args


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mongodb://bob:pw@h:1/db", "mongodb://bob:***@h:1/db"),
        (
            "mongodb+srv://bob:p%40ss@cluster.x/?tls=true",
            "mongodb+srv://bob:***@cluster.x/?tls=true",
        ),
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("at a=mongodb://u:x@h, b=amqp://v:y@k", "at a=mongodb://u:***@h, b=amqp://v:***@k"),
        ("mongodb://h/?password=abc&w=1", "mongodb://h/?password=***&w=1"),
        ("mongodb://h:1/db", "mongodb://h:1/db"),
    ],
)
def test_mask_hides_passwords(text: str, expected: str) -> None:
    assert mask(text) == expected


def test_known_secrets_are_masked_anywhere_even_decoded() -> None:
    secrets = secrets_of("mongodb://bob:p%40ss@h/")
    assert set(secrets) == {"p%40ss", "p@ss"}
    assert mask("auth failed for p@ss", secrets) == "auth failed for ***"
    assert secrets_of("mongodb://h/") == [] and secrets_of(None) == []


def test_log_records_are_masked_including_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    level = logging.getLogger().level
    handler = configure("INFO", secrets=["hunter2"], stream=stream)
    logger = logging.getLogger("docoutbox.test")
    try:
        logger.info("connect uri=%s", "mongodb://u:hunter2@h/")
        try:
            raise ValueError("bad password hunter2")
        except ValueError:
            logger.exception("failed")
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    out = stream.getvalue()
    assert "hunter2" not in out
    assert "uri=mongodb://u:***@h/" in out and "bad password ***" in out
    assert any(isinstance(f, MaskingFilter) for f in handler.filters)


def test_stream_positions_are_validated_before_use() -> None:
    token = {"_data": "6b026fbb00000004"}
    assert stream_args({"resume_after": token}) == {"resume_after": token}
    ts = Timestamp(1_800_000_000, 0)
    assert stream_args({"start_at": ts}) == {"start_at_operation_time": ts}
    for bad in [None, "x", {}, {"resume_after": {}}, {"start_at": 5}, {"a": 1, "b": 2}]:
        with pytest.raises(ChangeStreamLost):
            stream_args(bad)


def test_event_target() -> None:
    doc = {"_id": "a", "partition": 3, "outbox": [{"id": "e"}]}
    assert event_target(doc, 16) == ("a", 3)
    assert event_target({**doc, "partition": 19}, 16) == ("a", 3)
    assert event_target({**doc, "partition": None}, 16) == ("a", partition_of("a", 16))
    assert event_target({**doc, "outbox": []}, 16) is None
    assert event_target(None, 16) is None
    assert event_target({**doc, "_id": {"oid": 1}}, 16) is None


def test_tracker_moves_only_over_the_completed_prefix() -> None:
    flags = {"a": True, "b": False, "c": True}
    tracker = PositionTracker(0)
    for pos, key in enumerate("abc", start=1):
        tracker.add(pos, lambda key=key: flags[key])
    assert tracker.advance() and tracker.safe == 1
    assert not tracker.advance() and tracker.safe == 1
    flags["b"] = True
    assert tracker.advance() and tracker.safe == 3 and len(tracker) == 0


def test_an_unfinished_head_costs_one_check_however_many_events_wait() -> None:
    checks: list[int] = []
    tracker = PositionTracker(0)
    for pos in range(1, 201):
        tracker.add(pos, lambda pos=pos: checks.append(pos) is None and pos != 1)
    assert not tracker.advance()
    assert checks == [1]  # the control loop calls advance on every turn


def test_a_gate_waits_for_its_sweep_and_every_run() -> None:
    done = {"x": False}
    gate = Gate()
    gate.add(lambda: done["x"])
    assert not gate.done()
    gate.finished = True
    assert not gate.done()
    done["x"] = True
    assert gate.done()
    tracker = PositionTracker("old")
    tracker.add("e1")
    tracker.reset("marker", Gate())
    assert not tracker.advance() and tracker.safe == "old" and tracker.latest == "marker"


def test_a_ticket_needs_a_run_that_started_after_it() -> None:
    queue = AggregateQueue(workers=2)
    first = queue.request("a", 0)
    [run] = queue.start(0.0)
    second = queue.request("a", 0)  # arrives while the first run is under way
    third = queue.request("a", 0)  # coalesced with the second
    assert queue.start(0.0) == []  # serial per aggregate
    queue.finish(run, RunOutcome.DONE, 0.0)
    assert queue.done(first) and not queue.done(second)
    [again] = queue.start(0.0)
    queue.finish(again, RunOutcome.DONE, 0.0)
    assert queue.done(second) and queue.done(third) and queue.idle()
    assert queue.start(0.0) == []


def test_failed_runs_are_retried_with_backoff_and_never_dropped() -> None:
    queue = AggregateQueue(workers=1, backoff=Backoff(base=0.02, cap=0.05))
    ticket = queue.request("a", 0)
    [run] = queue.start(0.0)
    queue.finish(run, RunOutcome.RETRY, 0.0)
    assert queue.start(0.009) == []  # at least half the base delay
    due = queue.next_due(0.0)
    assert due is not None and 0.01 <= due <= 0.02
    [run] = queue.start(0.02)
    queue.finish(run, RunOutcome.UNAVAILABLE, 0.02)
    assert queue.start(0.029) == [] and not queue.done(ticket)
    [run] = queue.start(1.0)
    queue.finish(run, RunOutcome.DONE, 1.0)
    assert queue.done(ticket) and queue.idle()


def test_backoff_grows_and_is_capped() -> None:
    backoff = Backoff(base=0.1, cap=1.0)
    rng = random.Random(0)
    assert 0.05 <= backoff.delay(1, rng) <= 0.1
    assert 0.2 <= backoff.delay(3, rng) <= 0.4
    assert 0.5 <= backoff.delay(30, rng) <= 1.0


def test_concurrent_unavailable_runs_count_as_one_outage() -> None:
    queue = AggregateQueue(workers=4, backoff=Backoff(base=0.05, cap=10))
    tickets = [queue.request(f"a{i}", 0) for i in range(4)]
    runs = queue.start(0.0)
    assert len(runs) == 4  # concurrent across aggregates
    for run in runs:  # all four fail together, in one pause epoch
        queue.finish(run, RunOutcome.UNAVAILABLE, 0.0)
    assert queue.outages == 1
    assert queue.start(0.01) == []  # paused
    runs = queue.start(1.0)
    assert len(runs) == 4
    for run in runs:
        queue.finish(run, RunOutcome.DONE, 1.0)
    assert queue.outages == 0 and all(queue.done(t) for t in tickets)
