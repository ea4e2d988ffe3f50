"""The broker-neutral receive flow (docoutbox.receive) over the memory store: one write per
aggregate for a poll, per-aggregate order across failures and retries, requeues that hold
back later messages, dead letters, and the same verdicts from the sync and async drivers."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from benchmarks.ledger import Ledger, by_source, ledger_handlers, make_entry
from docoutbox import (
    Aggregate,
    AggregateStore,
    AsyncAggregateStore,
    Handlers,
    InboxPolicy,
    Message,
    NotFound,
    StoreConfig,
)
from docoutbox.codec import encode_entry
from docoutbox.errors import InvalidConfig, InvalidPayload, StoreError, TransientStoreError
from docoutbox.receive import (
    NO_RETRY,
    Action,
    AsyncReceiver,
    Delivery,
    HandlerRetry,
    Options,
    Receiver,
    Verdict,
    log_verdict,
)
from docoutbox.testing import AsyncMemoryBackend, MemoryBackend
from docoutbox_kafka import KafkaConsumer
from docoutbox_rabbitmq import RabbitConsumer
from tests.support import loopless
from tests.support.e2e import FaultyBackend

EXACT = StoreConfig(inbox=InboxPolicy(window=0, exact=True))
RETRY = HandlerRetry(immediate=1, delayed=2, base_delay=0.01, max_delay=0.02)


def deliveries(*entries: Any) -> list[Delivery]:
    return [Delivery(encode_entry(e)) for e in entries]


def failing(fails: dict[int, int], error: type[Exception] = RuntimeError) -> Any:
    """Ledger handlers where the message of ``seq`` (source a) fails its next N handlings."""
    calls: list[int] = []

    def handler(state: Ledger, message: Message) -> Any:
        assert message.seq is not None
        if message.source == "Producer/a" and fails.get(message.seq, 0) > 0:
            fails[message.seq] -= 1
            calls.append(message.seq)
            raise error(f"seq {message.seq} fails")
        return ledger_handlers(state, message)

    handler.calls = calls  # type: ignore[attr-defined]
    return handler


def receiver(
    backend: FaultyBackend, handler: Any = ledger_handlers, **options: Any
) -> tuple[Receiver[Ledger], list[tuple[int, Verdict]]]:
    kept: list[tuple[int, Verdict]] = []
    store = AggregateStore(backend, Ledger, EXACT)
    made = Receiver(
        store,
        handler,
        by_source,
        Options(create=True, retry=RETRY, keep=True, **options),
        keep=lambda index, verdict: kept.append((index, verdict)),
        sleep=lambda _: None,
    )
    return made, kept


def seqs(backend: FaultyBackend, source: str = "a") -> list[int]:
    return (
        AggregateStore(backend, Ledger).get(f"Producer/{source}").state.seqs[f"Producer/{source}"]
    )


def test_a_poll_is_one_write_per_aggregate() -> None:
    backend = FaultyBackend()
    writes: list[int] = []
    backend.after_write = lambda: writes.append(1)
    made, _ = receiver(backend)
    entries = [make_entry(p, seq) for seq in range(1, 6) for p in "ab"]
    verdicts = made.receive(deliveries(*entries, entries[0]))
    assert [v.action for v in verdicts] == [Action.ACK] * 11
    assert verdicts[-1].outcome is not None and verdicts[-1].outcome.duplicate
    assert len(writes) == 2
    assert seqs(backend, "a") == seqs(backend, "b") == [1, 2, 3, 4, 5]


def test_without_batch_each_message_is_its_own_write() -> None:
    backend = FaultyBackend()
    writes: list[int] = []
    backend.after_write = lambda: writes.append(1)
    made, _ = receiver(backend, batch=False)
    made.receive(deliveries(*[make_entry("a", seq) for seq in range(1, 6)]))
    assert len(writes) == 5 and seqs(backend) == [1, 2, 3, 4, 5]


def test_a_handler_that_fails_then_passes_keeps_the_order_of_its_aggregate() -> None:
    """Seq 2 fails twice: 3 and 4 wait for its retries instead of overtaking it."""
    backend = FaultyBackend()
    handler = failing({2: 2})
    made, kept = receiver(backend, handler)
    verdicts = made.receive(deliveries(*[make_entry("a", seq) for seq in range(1, 5)]))
    assert [v.action for v in verdicts] == [Action.ACK] * 4
    assert [v.attempts for v in verdicts] == [1, 3, 1, 1]
    assert seqs(backend) == [1, 2, 3, 4] and kept == []


def test_a_poison_message_is_retried_then_kept_and_the_rest_applied() -> None:
    backend = FaultyBackend()
    handler = failing({2: 99})
    made, kept = receiver(backend, handler)
    entries = [make_entry("a", seq) for seq in range(1, 5)] + [make_entry("b", 1)]
    verdicts = made.receive(deliveries(*entries))
    assert [v.action for v in verdicts] == [
        Action.ACK,
        Action.REJECT,
        Action.ACK,
        Action.ACK,
        Action.ACK,
    ]
    assert verdicts[1].attempts == 4 and verdicts[1].kept is True
    assert handler.calls == [2, 2, 2, 2]
    assert [index for index, _ in kept] == [1]
    assert seqs(backend) == [1, 3, 4] and seqs(backend, "b") == [1]


def test_a_requeue_holds_back_the_later_messages_of_its_aggregate_only() -> None:
    backend = FaultyBackend()
    handler = failing({2: 1}, TransientStoreError)
    made, _ = receiver(backend, handler)
    entries = [make_entry("a", seq) for seq in (1, 2, 3)] + [make_entry("b", 1)]
    verdicts = made.receive(deliveries(*entries))
    assert [v.action for v in verdicts] == [Action.ACK, Action.REQUEUE, Action.REQUEUE, Action.ACK]
    assert verdicts[2].attempts == 0  # not handled: it waits for seq 2
    assert seqs(backend) == [1] and seqs(backend, "b") == [1]


def test_a_reject_that_could_not_be_kept_is_requeued() -> None:
    backend = FaultyBackend()
    store = AggregateStore(backend, Ledger, EXACT)

    def keep(index: int, verdict: Verdict) -> None:
        raise StoreError("dead letters down")

    made = Receiver(store, ledger_handlers, by_source, Options(keep=True), keep=keep)
    (verdict,) = made.receive([Delivery(b"not json")])
    assert verdict.action is Action.REQUEUE and verdict.kept is False
    assert isinstance(verdict.keep_error, StoreError)


@pytest.mark.parametrize("batch", [True, False])
def test_the_async_driver_gives_the_same_verdicts(batch: bool) -> None:
    entries = [make_entry("a", seq) for seq in range(1, 5)] + [make_entry("b", 1)]
    polled = [*deliveries(*entries), Delivery(b"not json"), *deliveries(entries[0])]
    sync_backend = FaultyBackend()
    made, _ = receiver(sync_backend, failing({2: 99}), batch=batch)
    expected = made.receive(polled)

    async_backend = FaultyBackend()
    kept: list[int] = []

    async def keep(index: int, verdict: Verdict) -> None:
        kept.append(index)

    async def nap(seconds: float) -> None:
        return None

    store = AsyncAggregateStore(AsyncMemoryBackend(async_backend), Ledger, EXACT)
    options = Options(create=True, retry=RETRY, keep=True, batch=batch)
    amade = AsyncReceiver(store, failing({2: 99}), by_source, options, keep=keep, sleep=nap)
    got = loopless.run(amade.receive(polled))
    assert [(v.action, v.attempts, v.kept) for v in got] == [
        (v.action, v.attempts, v.kept) for v in expected
    ]
    assert kept == [1, 5]
    assert seqs(async_backend) == seqs(sync_backend) == [1, 3, 4]


def test_a_message_delivered_twice_in_a_poll_does_not_overtake_the_messages_between() -> None:
    """Seq 2 fails once and comes again after seq 3: seq 3 still waits for seq 2."""
    backend = FaultyBackend()
    made, _ = receiver(backend, failing({2: 1}))
    one, two, three = (make_entry("a", seq) for seq in (1, 2, 3))
    verdicts = made.receive(deliveries(one, two, three, two))
    assert [v.action for v in verdicts] == [Action.ACK] * 4
    assert seqs(backend) == [1, 2, 3]


def test_expected_rejections_log_one_warning_line_and_handler_bugs_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A body that is not a message, an unknown type or an invalid payload is normal
    input for a consumer: one warning line naming the message (ID and type) and the
    reason, no traceback. A handler that raises is a bug: an error with its traceback."""

    invalid = make_entry("c", 1)
    bodies = [
        b"not json at all",
        b'{"id": "x"}',
        encode_entry(make_entry("a", 1, type="NoSuchType")),
        encode_entry(invalid),
        encode_entry(make_entry("b", 1)),
    ]

    def handler(state: Ledger, message: Message) -> Any:
        if message.source == "Producer/b":
            raise RuntimeError("business rule broken")
        if message.source == "Producer/c":
            raise InvalidPayload("n must be\nbelow 1")
        return ledger_handlers(state, message)

    store = AggregateStore(FaultyBackend(), Ledger, EXACT)
    options = Options(create=True, retry=HandlerRetry(immediate=0, delayed=0))
    verdicts = Receiver(store, handler, by_source, options).receive(
        [Delivery(body) for body in bodies]
    )
    assert [v.action for v in verdicts] == [Action.REJECT] * 5
    log = logging.getLogger("docoutbox.test")
    with caplog.at_level(logging.DEBUG, logger="docoutbox.test"):
        for verdict, body in zip(verdicts, bodies, strict=True):
            log_verdict(log, verdict, body, "nowhere")
    records = caplog.records
    assert [r.levelname for r in records] == ["WARNING"] * 4 + ["ERROR"]
    for record in records[:4]:
        assert record.exc_info is None and "\n" not in record.getMessage()
    assert "b'not json at all'" in records[0].getMessage()
    assert "InvalidMessage" in records[1].getMessage()
    assert "(type NoSuchType): UnknownMessageType" in records[2].getMessage()
    assert f"message {invalid.id} (type Event): InvalidPayload: n must be below 1" in (
        records[3].getMessage()
    )
    assert records[4].exc_info is not None and "business rule broken" in caplog.text


# --- which message types may create their aggregate ----------------------------------


def _plain(mid: str, kind: str, account: str = "acc-1") -> Delivery:
    body = {"id": mid, "type": kind, "payload": {"account": account}}
    return Delivery(json.dumps(body).encode())


def _opening() -> Handlers[Opened]:
    handlers: Handlers[Opened] = Handlers()

    @handlers.on("Open")
    def open_(state: Opened, message: Message) -> Opened:
        return state.model_copy(update={"opened": True})

    @handlers.on("Deposit")
    def deposit(state: Opened, message: Message) -> Opened:
        return state.model_copy(update={"deposits": state.deposits + 1})

    return handlers


class Opened(Aggregate):
    opened: bool = False
    deposits: int = 0


def _opened_receiver(**options: Any) -> tuple[AggregateStore[Opened], Receiver[Opened]]:
    store = AggregateStore(MemoryBackend(), Opened)
    return store, Receiver(
        store,
        _opening(),
        lambda m: str(m.payload["account"]),
        Options(retry=NO_RETRY, **options),
    )


def test_a_creating_type_creates_a_missing_aggregate_and_others_do_not() -> None:
    store, receiver = _opened_receiver(creates={"Open"})
    early = receiver.receive([_plain("d-0", "Deposit")])
    assert early[0].action is Action.REJECT and isinstance(early[0].error, NotFound)
    assert store.load("acc-1") is None
    verdicts = receiver.receive([_plain("o-1", "Open"), _plain("d-1", "Deposit")])
    assert [v.action for v in verdicts] == [Action.ACK, Action.ACK]
    snapshot = store.load("acc-1")
    assert snapshot is not None and snapshot.state == Opened(opened=True, deposits=1)


def test_without_creating_types_a_first_message_is_not_found() -> None:
    store, receiver = _opened_receiver()
    verdict = receiver.receive([_plain("o-1", "Open")])[0]
    assert verdict.action is Action.REJECT and isinstance(verdict.error, NotFound)
    assert store.load("acc-1") is None


def test_a_creating_type_after_an_early_message_in_one_poll() -> None:
    store, receiver = _opened_receiver(creates={"Open"})
    verdicts = receiver.receive([_plain("d-1", "Deposit"), _plain("o-1", "Open")])
    assert [v.action for v in verdicts] == [Action.REJECT, Action.ACK]
    snapshot = store.load("acc-1")
    assert snapshot is not None and snapshot.state == Opened(opened=True, deposits=0)


@pytest.mark.parametrize("bad", ["Open", [""], [3], None])
def test_creating_types_are_checked(bad: Any) -> None:
    with pytest.raises(InvalidConfig, match="message type"):
        Options(creates=bad)


def test_consumers_pass_their_creating_types_on() -> None:

    store = AggregateStore(MemoryBackend(), Opened)
    rabbit = RabbitConsumer(
        "amqp://guest:guest@127.0.0.1:5672/",
        "q",
        store,
        _opening(),
        aggregate_id_of=str,
        creates=["Open"],
    )
    kafka = KafkaConsumer(
        "127.0.0.1:9",
        "t",
        "g",
        store,
        _opening(),
        aggregate_id_of=str,
        dead_letters=object(),
        creates=("Open",),
    )
    assert rabbit._options().creates == kafka._options().creates == {"Open"}
    with pytest.raises(InvalidConfig, match="message types"):
        RabbitConsumer(
            "amqp://127.0.0.1/", "q", store, _opening(), aggregate_id_of=str, creates="Open"
        )
