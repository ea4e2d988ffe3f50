"""Randomized batches under faults, seeded: crashes between load and commit, ambiguous
writes, failed writes, a rival writer committing in between, failing handlers, and
redelivery of everything not acknowledged. Every message takes effect exactly once."""

from __future__ import annotations

import random
from typing import Any

import pytest

from docoutbox import AggregateStore, InboxPolicy, Message, RetryPolicy, Status, StoreConfig
from docoutbox.errors import TransientStoreError
from docoutbox.store.batch import Failed
from docoutbox.store.plans import CommitPlan, WritePlan
from docoutbox.testing import MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers


class Crash(BaseException):
    """The process dies before its write reaches the database."""


class Chaos(MemoryBackend):
    def __init__(self, rng: random.Random, *, crashes: bool) -> None:
        super().__init__()
        self.rng = rng
        self.crashes = crashes
        self.on = True
        self.rival: Any = None
        self.rival_count = 0
        self.faults = {"crash": 0, "lost_reply": 0, "failed": 0, "rival": 0}

    def write(self, plan: WritePlan) -> bool:
        if self.on and isinstance(plan, CommitPlan):
            roll = self.rng.random()
            if roll < 0.05 and self.crashes:
                self.faults["crash"] += 1
                raise Crash
            if roll < 0.10:
                self.faults["failed"] += 1
                raise TransientStoreError("write failed")
            if roll < 0.15 and self.rival is not None:
                # Another process commits to the same aggregate between our load and write.
                self.faults["rival"] += 1
                self.rival_count += 1
                rival = add_msg(f"rival-{self.rival_count}", source="R/1", seq=self.rival_count)
                self.on = False
                try:
                    assert self.rival.handle("c", rival, counter_handlers).applied
                finally:
                    self.on = True
            if roll > 0.95:
                self.faults["lost_reply"] += 1
                super().write(plan)
                raise TransientStoreError("reply lost")
        return super().write(plan)


def store_for(backend: Chaos, policy: InboxPolicy) -> AggregateStore[Counter]:
    config = StoreConfig(inbox=policy, retry=RetryPolicy(max_attempts=3, base_delay=0.0))
    return AggregateStore(backend, Counter, config, sleep=lambda s: None)


def message(index: int, exact: bool) -> Message:
    if index % 13 == 7:
        return Message(id=f"boom-{index}", type="Boom", source="P/1", seq=index + 1)
    extra: dict[str, Any] = {"source": "P/1", "seq": index + 1} if exact else {}
    return add_msg(f"m{index}", n=index + 1, emits=index % 3, **extra)


@pytest.mark.parametrize("seed", range(15))
def test_random_batches_under_faults_apply_each_message_once(seed: int) -> None:
    """Modes by seed: exact marks; a window wider than everything; a window of 4, smaller
    than most batches. With the small window only what was not acknowledged is delivered
    again, at once, and no crash happens between a batch's commits: a redelivery never
    reaches further back than the window (which must be sized for the consumer's
    redelivery horizon, as for handle), while inside one call the batch is larger."""
    rng = random.Random(seed)
    mode = seed % 3
    exact = mode == 0
    policy = {
        0: InboxPolicy(window=0, exact=True),
        1: InboxPolicy(window=1000),
        2: InboxPolicy(window=4),
    }[mode]
    backend = Chaos(rng, crashes=mode != 2)
    store = store_for(backend, policy)
    store.create("c", Counter())
    backend.rival = store_for(backend, InboxPolicy(window=0, exact=True))
    messages = [message(i, exact) for i in range(100)]
    unacked = list(range(len(messages)))
    acked: set[int] = set()
    failed: set[int] = set()
    calls = 0
    redo: list[int] = []
    while unacked:
        calls += 1
        if calls > 2000:
            raise AssertionError("did not converge")
        if calls > 300:
            backend.on = False  # faults stop; the backlog must drain
        size = rng.randint(1, 12)
        picks = [rng.choice(unacked) for _ in range(size)]
        # Redeliveries of acknowledged messages ride along (within the window's horizon).
        recent = sorted(acked) if mode != 2 else []
        if recent and rng.random() < 0.5:
            picks.insert(rng.randrange(len(picks) + 1), rng.choice(recent))
        if redo and mode == 2:
            picks = list(dict.fromkeys(redo))
        redo = []
        try:
            result = store.handle_batch("c", [messages[i] for i in picks], counter_handlers)
        except Crash:
            store = store_for(backend, policy)  # a new process: empty cache
            continue
        for index, outcome in zip(picks, result.results, strict=True):
            if isinstance(outcome, Failed):
                if messages[index].type == "Boom":
                    failed.add(index)
                    acked.add(index)  # dead-lettered by the consumer
                    if index in unacked:
                        unacked.remove(index)
                else:
                    assert isinstance(outcome.error, TransientStoreError), outcome.error
                    redo.append(index)
                continue
            if outcome.status is Status.GAVE_UP:
                redo.append(index)
                continue
            acked.add(index)
            if index in unacked:
                unacked.remove(index)
    assert sum(backend.faults.values()) > 0
    snapshot = store.get("c")
    state = snapshot.state
    rivals = [f"rival-{i}" for i in range(1, backend.rival_count + 1)]
    expected = [m.id for m in messages if m.type == "Add"]
    assert len(state.applied) == len(set(state.applied)), "a message was applied twice"
    assert sorted(state.applied) == sorted(expected + rivals)
    assert state.total == sum(m.payload["n"] for m in messages if m.type == "Add") + len(rivals)  # type: ignore[misc]
    emitted = sum(m.payload["emits"] for m in messages if m.type == "Add") + len(rivals)  # type: ignore[misc]
    assert [e.seq for e in snapshot.outbox] == list(range(1, emitted + 1))
    assert {m.id for i, m in enumerate(messages) if i in failed} == {
        m.id for m in messages if m.type == "Boom"
    }
