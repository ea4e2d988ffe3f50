"""The claim check on memory ports: puts before the commit, fresh puts only, resolves
before publishing, deletes after the trim, publishes references on request, and the
orphan sweep removes only old, unreferenced, unrefreshed payloads."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from docoutbox import AggregateStore, AsyncAggregateStore, Decision, Emit, StoreConfig
from docoutbox.dispatch.drivers.operations import AsyncPorts, Ports
from docoutbox.dispatch.drivers.ownership import SoleOwner
from docoutbox.dispatch.engine.flow import DispatchPolicy
from docoutbox.dispatch.engine.loop import DispatchEngine, DispatcherConfig
from docoutbox.drive import drive
from docoutbox.errors import InvalidConfig, InvalidInput, PayloadMissing, TransientStoreError
from docoutbox.model import Message
from docoutbox.ports.payloads import PayloadInfo
from docoutbox.retry import Backoff
from docoutbox.store.core import Sleep
from docoutbox.store.plans import TrimPlan, WritePlan
from docoutbox.stored import AesGcm, Codec, Keyring, Zlib
from docoutbox.stored.claim import (
    ClaimCheck,
    DeletePayloads,
    GetPayload,
    is_reference,
    payload_id,
    resolve_reference,
    resolve_reference_async,
)
from docoutbox.stored.reference import ENVELOPE
from docoutbox.stored.sweep import sweep_orphans, sweep_orphans_async
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints
from docoutbox.testing.memory import AsyncMemoryBackend, MemoryBackend
from docoutbox.testing.payloads import AsyncMemoryPayloads, MemoryPayloads
from docoutbox.testing.publisher import AsyncMemoryPublisher, MemoryDeadLetters, MemoryPublisher
from docoutbox_app.wiring import DispatchOptions, kit_payloads
from tests.support.dispatch_flow import dispatch_run
from tests.support.loopless import run

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BIG = {"blob": "x" * 5000}
SMALL = {"n": 1}


class Box(BaseModel):
    count: int = 0


def emit(payload: dict[str, Any]) -> Callable[[Box, Message], Any]:
    def handler(state: Box, message: Message) -> Any:
        return Decision(Box(count=state.count + 1), Emit(type="Stored", payload=payload))

    return handler


class Clock:
    def __init__(self) -> None:
        self.now = T0
        self.seconds = 0.0

    def wall(self) -> datetime:
        return self.now

    def timer(self) -> float:
        return self.seconds


class Recording(MemoryBackend):
    """A memory backend that logs its writes into the payload store's log."""

    def __init__(self, payloads: MemoryPayloads) -> None:
        super().__init__()
        self.payloads = payloads
        self.fail_trims = False

    def write(self, plan: WritePlan) -> bool:
        self.payloads.log.append(("write", str(plan.aggregate_id)))
        if self.fail_trims and isinstance(plan, TrimPlan):
            return False
        return super().write(plan)


def store(
    payloads: MemoryPayloads,
    clock: Clock | None = None,
    codec: Codec | None = None,
    threshold: int = 1000,
    backend: MemoryBackend | None = None,
) -> AggregateStore[Box]:
    clock = clock or Clock()
    config = StoreConfig(
        claim_check=ClaimCheck(payloads, threshold=threshold, grace=100.0, refresh=0.25),
        codec=codec,
        clock=clock.wall,
        timer=clock.timer,
        rng=random.Random(7),
    )
    return AggregateStore(backend or Recording(payloads), Box, config)


def message(n: int) -> dict[str, Any]:
    return {"id": f"m{n}", "type": "Go", "payload": {}}


# -- the store ------------------------------------------------------------------------------


def test_a_large_payload_is_put_before_the_commit_and_referenced() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    s.handle("a", message(2), emit(SMALL))
    big, small = s.backend.docs["a"]["outbox"]  # type: ignore[attr-defined]
    assert "payload" not in big and big["claim"]["size"] == len(json.dumps(BIG).replace(" ", ""))
    assert small["payload"] == SMALL and "claim" not in small
    assert payloads.log[:2] == [("put", big["claim"]["id"]), ("write", "a")]
    assert json.loads(payloads.get(big["claim"]["id"])) == BIG


def test_the_threshold_applies_to_the_encoded_size_and_the_payload_is_stored_encoded() -> None:
    keyring = Keyring({"k": bytes(32)}, "k")
    payloads = MemoryPayloads()
    s = store(payloads, codec=Codec(Zlib(), AesGcm(keyring)))
    s.handle("a", message(1), emit(BIG), create=True)  # compresses under the threshold
    assert "claim" not in s.backend.docs["a"]["outbox"][0]  # type: ignore[attr-defined]
    rng = random.Random(3)
    noisy = {"blob": "".join(rng.choice("abcdefgh0123") for _ in range(4000))}
    s.handle("a", message(2), emit(noisy))
    entry = s.backend.docs["a"]["outbox"][1]  # type: ignore[attr-defined]
    stored = payloads.get(entry["claim"]["id"])
    assert entry["claim"]["encoded"] and b"abcdefgh" not in stored
    assert json.loads(stored).startswith("dx1:zlib+aesgcm:")


def test_a_put_older_than_the_fresh_bound_is_made_again_before_the_commit() -> None:
    clock = Clock()

    class Slow(MemoryPayloads):
        def put(self, info: PayloadInfo, data: bytes) -> None:
            super().put(info, data)
            if len(self.log) == 1:
                clock.seconds += 30.0  # the first put takes 30 s (the bound: 25 s)

    payloads = Slow()
    s = store(payloads, clock)
    s.handle("a", message(1), emit(BIG), create=True)
    assert [name for name, _ in payloads.log] == ["put", "put", "write"]


def test_puts_that_stay_slow_commit_nothing() -> None:
    clock = Clock()

    class Slow(MemoryPayloads):
        def put(self, info: PayloadInfo, data: bytes) -> None:
            super().put(info, data)
            clock.seconds += 40.0

    payloads = Slow()
    s = store(payloads, clock)
    with pytest.raises(TransientStoreError, match="grace"):
        s.handle("a", message(1), emit(BIG), create=True)
    assert "a" not in s.backend.docs  # type: ignore[attr-defined]
    assert [name for name, _ in payloads.log] == ["put"] * 3


def test_the_payload_id_follows_the_entry_and_its_content() -> None:
    entry = {"aggregate_type": "Box", "aggregate_id": "a", "id": "e1"}
    assert payload_id(entry, b"1") == payload_id(dict(entry), b"1")
    assert payload_id(entry, b"1") != payload_id(entry, b"2")
    assert payload_id(entry, b"1") != payload_id({**entry, "id": "e2"}, b"1")


def test_batches_claim_check_too() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle_batch("a", [message(1), message(2)], emit(BIG), create=True)
    outbox = s.backend.docs["a"]["outbox"]  # type: ignore[attr-defined]
    assert all("claim" in e for e in outbox) and len(payloads.items) == 2


def test_an_unresolved_entry_reads_as_its_reference() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    (entry,) = s.get("a").outbox
    assert is_reference(entry.payload) and entry.payload[ENVELOPE]["size"] > 1000


def test_the_payload_store_must_match_the_store() -> None:
    config = StoreConfig(claim_check=ClaimCheck(AsyncMemoryPayloads()))
    with pytest.raises(InvalidConfig, match="sync payload store"):
        AggregateStore(MemoryBackend(), Box, config)
    with pytest.raises(InvalidConfig, match="PayloadStore"):
        ClaimCheck(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match="payload store"):
        Ports(MemoryBackend(), MemoryPublisher(), MemoryDeadLetters(), payloads=payloads_async())


def payloads_async() -> Any:
    return AsyncMemoryPayloads()


def test_async_stores_take_async_payload_stores() -> None:
    config = StoreConfig(claim_check=ClaimCheck(MemoryPayloads()))
    with pytest.raises(InvalidConfig, match="async payload store"):
        AsyncAggregateStore(AsyncMemoryBackend(), Box, config)


# -- the dispatch flow ----------------------------------------------------------------------


def dispatch(
    backend: MemoryBackend,
    payloads: MemoryPayloads,
    references: bool = False,
    dead_lettered: frozenset[str] = frozenset(),
) -> tuple[list[Any], Any]:
    """One run over aggregate ``a``; the dead letters refer to ``dead_lettered``."""
    return dispatch_run(
        backend, payloads, T0, references=references, refers_to=dead_lettered.__contains__
    )


def kinds(ops: list[Any]) -> list[str]:
    return [type(op).__name__ for op in ops]


def test_the_dispatcher_publishes_the_payload_and_deletes_it_after_the_trim() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    ops, result = dispatch(s.backend, payloads)  # type: ignore[arg-type]
    assert kinds(ops) == ["GetPayload", "Publish", "Write", "DeadLettered", "DeletePayloads"]
    assert ops[1].entry.payload == BIG and result.trimmed
    assert payloads.items == {} and s.backend.docs["a"]["outbox"] == []  # type: ignore[attr-defined]


def test_a_payload_a_dead_letter_refers_to_is_kept_after_the_trim() -> None:
    # Quarantined once, then published from another copy (a trim whose reply was lost):
    # the dead letter must stay replayable, so the payload is left to the sweep.
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    (payload_id,) = payloads.items
    ops, result = dispatch(s.backend, payloads, dead_lettered=frozenset({payload_id}))  # type: ignore[arg-type]
    assert kinds(ops) == ["GetPayload", "Publish", "Write", "DeadLettered"]
    assert result.trimmed and list(payloads.items) == [payload_id] and result.orphaned == []


def test_no_delete_when_the_trim_did_not_apply() -> None:
    payloads = MemoryPayloads()
    backend = Recording(payloads)
    s = store(payloads, backend=backend)
    s.handle("a", message(1), emit(BIG), create=True)
    backend.fail_trims = True
    ops, _ = dispatch(backend, payloads)
    assert kinds(ops) == ["GetPayload", "Publish", "Write"] and len(payloads.items) == 1


def test_a_missing_payload_is_neither_published_nor_trimmed() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    s.handle("a", message(2), emit({"blob": "y" * 5000}))
    s.handle("a", message(3), emit(SMALL))
    payloads.items.clear()
    ops, result = dispatch(s.backend, payloads)  # type: ignore[arg-type]
    assert kinds(ops) == ["GetPayload"]  # the later ones wait, unread
    assert len(result.missing) == 1 and len(result.held) == 3 and not result.published
    assert len(s.backend.docs["a"]["outbox"]) == 3  # type: ignore[attr-defined]


def test_a_payload_of_exactly_the_threshold_stays_in_its_entry() -> None:
    payloads = MemoryPayloads()
    inline = {"blob": "x" * (1000 - len('{"blob":""}'))}
    s = store(payloads)
    s.handle("a", message(1), emit(inline), create=True)
    s.handle("a", message(2), emit({"blob": inline["blob"] + "x"}))
    first, second = s.backend.docs["a"]["outbox"]  # type: ignore[attr-defined]
    assert "claim" not in first and second["claim"]["size"] == 1001


def test_a_partial_payload_is_missing() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)
    (pid,) = payloads.items
    info, _ = payloads.items[pid]
    payloads.items[pid] = (info, b'{"blob":"cut short"}')  # JSON, but not what was put
    _, result = dispatch(s.backend, payloads)  # type: ignore[arg-type]
    assert result.missing and not result.published


def test_references_are_published_as_envelopes_and_resolved_by_consumers() -> None:
    keyring = Keyring({"k": bytes(32)}, "k")
    codec = Codec(AesGcm(keyring))
    payloads = MemoryPayloads()
    s = store(payloads, codec=codec)
    s.handle("a", message(1), emit(BIG), create=True)
    ops, _ = dispatch(s.backend, payloads, references=True)  # type: ignore[arg-type]
    assert kinds(ops) == ["Publish", "Write"]  # no read, no delete: the sweep removes it
    published = ops[0].entry.payload
    assert is_reference(published)
    assert resolve_reference(published, payloads, codec) == BIG
    with pytest.raises(InvalidConfig, match="codec"):
        resolve_reference(published, payloads)
    payloads.items.clear()
    with pytest.raises(PayloadMissing):
        resolve_reference(published, payloads, codec)


# -- the orphan sweep -----------------------------------------------------------------------


def test_the_sweep_removes_only_old_unreferenced_payloads() -> None:
    payloads = MemoryPayloads()
    clock = Clock()
    s = store(payloads, clock)
    s.handle("a", message(1), emit(BIG), create=True)  # referenced, pending
    orphan = PayloadInfo("orphan", "a", "gone", 3, T0, "g")
    young = PayloadInfo("young", "a", "gone", 3, T0 + timedelta(seconds=90), "g")
    payloads.put(orphan, b"abc")
    payloads.put(young, b"abc")
    report = sweep_orphans(
        s.backend, payloads, 100.0, dead_letters=None, now=T0 + timedelta(seconds=150)
    )
    assert report.deleted == ["orphan"] and len(report.referenced) == 1
    assert set(payloads.items) == {"young", *report.referenced}


def test_the_sweep_keeps_a_payload_put_again_after_it_was_listed() -> None:
    payloads = MemoryPayloads()
    backend = MemoryBackend()
    old = PayloadInfo("p", "a", "e", 3, T0, "g1")
    payloads.put(old, b"abc")

    class Refreshing(MemoryBackend):
        def load(self, aggregate_id: Any) -> Any:
            payloads.put(PayloadInfo("p", "a", "e", 3, T0 + timedelta(seconds=200), "g2"), b"abc")
            return backend.load(aggregate_id)

    report = sweep_orphans(
        Refreshing(), payloads, 100.0, dead_letters=None, now=T0 + timedelta(seconds=200)
    )
    assert report.refreshed == ["p"] and "p" in payloads.items


def test_the_wiring_refuses_a_claim_check_on_a_kit_without_payloads() -> None:
    assert kit_payloads(object(), DispatchOptions()) is None
    with pytest.raises(InvalidConfig, match="payload store"):
        kit_payloads(object(), DispatchOptions(claim_check=True))

    class Kit:
        payloads = MemoryPayloads()

    assert kit_payloads(Kit(), DispatchOptions(claim_check=True)) is Kit.payloads
    config = DispatchOptions(claim_check=True, publish_references=True).config()
    assert config.publish_references


# -- the async twins, and failures on the way ------------------------------------------------


def test_the_async_store_dispatch_ports_sweep_and_resolve_share_the_flows() -> None:
    shared = MemoryPayloads()
    payloads = AsyncMemoryPayloads(shared)
    backend = AsyncMemoryBackend()
    clock = Clock()
    config = StoreConfig(
        claim_check=ClaimCheck(payloads, threshold=1000), clock=clock.wall, timer=clock.timer
    )
    store = AsyncAggregateStore(backend, Box, config)
    run(store.handle("a", message(1), emit(BIG), create=True))
    (entry,) = run(backend.load("a"))["outbox"]
    pid = entry["claim"]["id"]
    assert [name for name, _ in shared.log] == ["put"]
    ports = AsyncPorts(backend, AsyncMemoryPublisher(), MemoryDeadLettersAsync(), payloads=payloads)
    assert json.loads(run(ports.perform(GetPayload(pid)))) == BIG
    envelope = run(store.get("a")).outbox[0].payload
    assert run(resolve_reference_async(envelope, payloads)) == BIG
    run(ports.perform(DeletePayloads((pid,))))
    assert shared.items == {}
    shared.put(PayloadInfo("orphan", "a", "gone", 1, T0, "g"), b"x")
    report = run(
        sweep_orphans_async(
            backend, payloads, 100.0, dead_letters=None, now=T0 + timedelta(hours=1)
        )
    )
    assert report.deleted == ["orphan"]


class MemoryDeadLettersAsync:
    async def put(self, aggregate_id: Any, entry: Any, error: str, attempts: int) -> None:
        raise AssertionError("nothing is quarantined here")


def test_a_failed_delete_leaves_an_orphan_and_the_run_goes_on() -> None:
    payloads = MemoryPayloads()
    s = store(payloads)
    s.handle("a", message(1), emit(BIG), create=True)

    class Failing(MemoryPayloads):
        def delete(self, payload_ids: Any) -> None:
            raise TransientStoreError("the payload store is down")

    broken = Failing()
    broken.items = payloads.items
    ops, result = dispatch(s.backend, broken)  # type: ignore[arg-type]
    assert kinds(ops) == ["GetPayload", "Publish", "Write", "DeadLettered", "DeletePayloads"]
    assert result.trimmed and result.published and len(result.orphaned) == 1
    assert len(payloads.items) == 1  # left to the sweep


def test_a_failed_put_commits_nothing() -> None:
    class Failing(MemoryPayloads):
        def put(self, info: PayloadInfo, data: bytes) -> None:
            raise TransientStoreError("the payload store is down")

    s = store(Failing())
    with pytest.raises(TransientStoreError, match="down"):
        s.handle("a", message(1), emit(BIG), create=True)
    assert "a" not in s.backend.docs  # type: ignore[attr-defined]


def test_a_reference_that_is_not_one_is_refused() -> None:
    payloads = MemoryPayloads()
    with pytest.raises(InvalidInput, match="envelope"):
        resolve_reference({"data": 1}, payloads)
    entry = {"id": "e", "type": "T", "seq": 1, "claim": {"size": 3}, "aggregate_id": "a"}
    ops, result = _flow_of({"_id": "a", "outbox": [entry]}, payloads)
    assert kinds(ops) == ["Quarantine", "Write"] and result.quarantined == ["e"]


def _flow_of(doc: dict[str, Any], payloads: MemoryPayloads) -> tuple[list[Any], Any]:
    backend = MemoryBackend()
    backend.docs["a"] = doc
    return dispatch(backend, payloads)


def _engine(
    backend: MemoryBackend, publisher: MemoryPublisher, payloads: MemoryPayloads, **options: Any
) -> Callable[[], None]:
    """A stream-following engine over ``backend``; what runs one step of it (5 ms later)."""
    ports = Ports(
        backend,
        publisher,
        MemoryDeadLetters(),
        MemoryChangeSource(backend),
        MemoryCheckpoints(),
        payloads=payloads,
    )
    now = [0.0]
    config = DispatcherConfig(
        name="t", sweep_interval=3600, poll_interval=0.005, checkpoint_interval=0, **options
    )
    engine = DispatchEngine(
        config,
        SoleOwner(),
        stream=True,
        checkpoints=True,
        monotonic=lambda: now[0],
        clock=lambda: T0 + timedelta(seconds=now[0]),
        rng=random.Random(1),
    )
    engine.begin()

    def perform(op: Any) -> Any:
        if isinstance(op, Sleep):
            now[0] += op.seconds
            return None
        return ports.perform(op)

    def step() -> None:
        now[0] += 0.005
        drive(engine.turn(), perform)
        for slot in engine.start_runs():
            engine.finish(slot, drive(engine.run(slot), perform))

    return step


def test_a_missing_payload_retries_its_aggregate_and_pauses_no_other() -> None:
    """The run is retried after a backoff (RETRY), not taken for a broker outage
    (UNAVAILABLE), which would pause every aggregate."""

    class Flaky(MemoryPayloads):
        missing = True
        gets = 0

        def get(self, payload_id: str) -> bytes:
            self.gets += 1
            if self.missing:
                raise PayloadMissing("not there yet (a replica behind)")
            return super().get(payload_id)

    payloads = Flaky()
    backend = MemoryBackend()
    s = store(payloads, backend=backend)
    s.handle("a", message(1), emit(BIG), create=True)
    s.handle("a", message(2), emit(SMALL))
    publisher = MemoryPublisher()
    step = _engine(backend, publisher, payloads, backoff=Backoff(base=1.0, cap=1.0))  # 200 steps

    while not payloads.gets:
        step()
    s.handle("b", message(3), emit(SMALL), create=True)
    for _ in range(5):
        step()
    assert [m.aggregate_id for m in publisher.published] == ["b"]  # not paused by "a"
    assert len(backend.docs["a"]["outbox"]) == 2
    payloads.missing = False
    for _ in range(400):
        step()
        if not backend.docs["a"]["outbox"]:
            break
    assert [m.payload for m in publisher.published] == [SMALL, BIG, SMALL]
    assert backend.docs["a"]["outbox"] == [] and payloads.items == {}


@pytest.mark.parametrize("trim_every", [16, 1])
def test_with_deferred_trims_a_run_trims_its_claimed_entries_itself_and_deletes_them(
    trim_every: int,
) -> None:
    """Rule: a payload is deleted once its entry's trim committed. A deferred trim commits
    later, so a run writes a trim that frees payloads itself, instead of leaving them to
    the orphan sweep; its other trims, and those of other aggregates, stay deferred."""
    payloads = MemoryPayloads()
    backend = MemoryBackend()
    s = store(payloads, backend=backend)
    s.handle("a", message(1), emit(BIG), create=True)
    s.handle("a", message(2), emit(SMALL))
    s.handle("b", message(3), emit(SMALL), create=True)
    publisher = MemoryPublisher()
    policy = DispatchPolicy(trim_every=trim_every)
    step = _engine(backend, publisher, payloads, trim_delay=60.0, policy=policy)
    for _ in range(3):
        step()
    assert sorted(m.aggregate_id for m in publisher.published) == ["a", "a", "b"]
    assert payloads.items == {}
    # One trim of both, or the claimed entry's first and the other's deferred:
    assert len(backend.docs["a"]["outbox"]) == (0 if trim_every > 1 else 1)
    assert len(backend.docs["b"]["outbox"]) == 1  # its trim waits for the flush
