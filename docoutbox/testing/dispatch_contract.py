"""Contracts of the dispatcher's ports: every adapter, sync or async, must pass these tests.

Reuse them for your own adapter by subclassing and providing the fixture each names:

- :class:`ChangeSourceContract`: ``change_source``, a ``(source, backend)`` pair: a
  :class:`~docoutbox.ports.dispatch.ChangeSource` over one fresh, empty collection and the
  :class:`~docoutbox.ports.store.StoreBackend` writing to that collection;
- :class:`CheckpointsContract`: ``checkpoints``, fresh
  :class:`~docoutbox.ports.dispatch.Checkpoints`;
- :class:`LeaseTableContract`: ``lease_table``, a fresh
  :class:`~docoutbox.ports.dispatch.LeaseTable` group;
- :class:`DeadLettersContract`: ``dead_letters``, a ``(port, count)`` pair, ``count()``
  being how many entries the store holds (the port answers the orphan sweep's
  ``refers_to`` too, :class:`~docoutbox.ports.payloads.ClaimedByDeadLetters`);
- :class:`PublisherContract`: ``publisher``, a ``(port, received)`` pair, ``received()``
  the IDs of the entries the broker accepted so far, in order, read back from the broker;
- :class:`BrokerPublisherContract`: the same, and ``unreachable_publisher``, for a
  publisher whose broker refuses destinations it does not know and can be away.

Async ports (:class:`~docoutbox.ports.dispatch.AsyncChangeSource` and the other twins)
run the same tests wrapped in :class:`~docoutbox.testing.blocking.BlockingStore`, which
works for any object with coroutine methods.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox.errors import BrokerUnavailable, ChangeStreamLost, PublishError
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import ChangeEvent
from docoutbox.store.api import AggregateStore
from docoutbox.store.document import utcnow
from docoutbox.testing.contract import Counter, add_msg, counter_handlers

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def events_until(
    source: Any,
    wanted: Callable[[list[ChangeEvent]], bool],
    timeout: float = 10.0,
    batch_size: int = 10,
) -> list[ChangeEvent]:
    """Poll ``source`` until the events seen satisfy ``wanted``."""
    seen: list[ChangeEvent] = []
    deadline = time.monotonic() + timeout
    while not wanted(seen):
        assert time.monotonic() < deadline, f"only saw {seen!r}"
        batch = source.poll(batch_size)
        seen.extend(batch)
        if not batch:
            time.sleep(0.02)
    return seen


def _with_docs(events: list[ChangeEvent]) -> list[Any]:
    return [e.document["_id"] for e in events if e.document is not None]


class ChangeSourceContract:
    """Behaviour every change source must show.

    Changes of one aggregate always arrive in commit order. A source whose stream is
    split (Cosmos DB reads each feed range on its own) sets ``ordered_across_aggregates``
    to False: changes of different aggregates may then arrive in any order.
    """

    ordered_across_aggregates = True

    def test_changes_after_the_start_marker_arrive_in_commit_order(
        self, change_source: tuple[Any, Any]
    ) -> None:
        source, backend = change_source
        store = AggregateStore(backend, Counter)
        source.open(source.start_marker())
        try:
            for i in range(3):
                store.handle(f"a{i}", add_msg(f"m{i}"), counter_handlers, create=True)
            events = events_until(source, lambda seen: len(_with_docs(seen)) >= 3)
            if self.ordered_across_aggregates:
                assert _with_docs(events)[:3] == ["a0", "a1", "a2"]
            else:
                assert sorted(_with_docs(events)[:3]) == ["a0", "a1", "a2"]
            doc = next(e.document for e in events if e.document is not None)
            assert doc["outbox"] and doc["outbox"][0]["seq"] == 1  # the document after it
        finally:
            source.close()

    def test_a_position_resumes_right_after_its_event(self, change_source: tuple[Any, Any]) -> None:
        source, backend = change_source
        store = AggregateStore(backend, Counter)
        source.open(source.start_marker())
        try:
            store.handle("a", add_msg("m1"), counter_handlers, create=True)
            store.handle("b", add_msg("m2"), counter_handlers, create=True)
            # One event per poll: a source may give the events of one batch (a Cosmos DB
            # page) the position before the batch, so as never to skip its tail.
            events = events_until(source, lambda seen: len(_with_docs(seen)) >= 1, batch_size=1)
            first = next(e for e in events if e.document is not None)
            assert first.document is not None
            if self.ordered_across_aggregates:
                assert first.document["_id"] == "a"
            other = "b" if first.document["_id"] == "a" else "a"
            source.open(first.position)
            again = events_until(source, lambda seen: len(_with_docs(seen)) >= 1)
            assert _with_docs(again)[0] == other
        finally:
            source.close()

    @pytest.mark.parametrize("bad", ["not a position", {"x": 1}, [1, 2], True])
    def test_an_unusable_position_is_a_lost_stream(
        self, change_source: tuple[Any, Any], bad: Any
    ) -> None:
        source, _ = change_source

        def open_and_poll() -> None:  # a source may find out when it opens, or first polls
            source.open(bad)
            source.poll(1)

        with pytest.raises(ChangeStreamLost):
            open_and_poll()

    def test_polling_a_closed_stream_is_a_lost_stream(self, change_source: tuple[Any, Any]) -> None:
        source, _ = change_source
        source.open(source.start_marker())
        source.close()
        source.close()  # closing twice is harmless
        with pytest.raises(ChangeStreamLost):
            source.poll(1)


class CheckpointsContract:
    """Behaviour every checkpoint store must show."""

    def test_an_unknown_name_has_no_position(self, checkpoints: Any) -> None:
        assert checkpoints.load("nobody") is None

    def test_the_last_save_wins_per_name(self, checkpoints: Any) -> None:
        checkpoints.save("a", {"resume_after": {"_data": "01"}})
        checkpoints.save("a", {"resume_after": {"_data": "02"}})
        checkpoints.save("b", {"resume_after": {"_data": "09"}})
        assert checkpoints.load("a") == {"resume_after": {"_data": "02"}}
        assert checkpoints.load("b") == {"resume_after": {"_data": "09"}}


class LeaseTableContract:
    """Behaviour every lease table must show: conditional writes, losers get False."""

    def test_a_free_partition_is_acquired_once(self, lease_table: Any) -> None:
        later = NOW + timedelta(seconds=10)
        assert lease_table.acquire(0, "a", NOW, later)
        assert not lease_table.acquire(0, "b", NOW, later)
        assert lease_table.acquire(0, "a", NOW, later)  # its owner may take it again
        assert lease_table.read().leases == {0: ("a", later)}

    def test_an_expired_lease_is_taken_over(self, lease_table: Any) -> None:
        assert lease_table.acquire(1, "a", NOW, NOW + timedelta(seconds=1))
        later = NOW + timedelta(seconds=2)
        assert lease_table.acquire(1, "b", later, later + timedelta(seconds=10))
        assert lease_table.read().leases[1][0] == "b"

    def test_renew_and_release_touch_only_the_owners_leases(self, lease_table: Any) -> None:
        soon, later = NOW + timedelta(seconds=5), NOW + timedelta(seconds=50)
        assert lease_table.acquire(0, "a", NOW, soon)
        assert lease_table.acquire(1, "b", NOW, soon)
        lease_table.renew([0, 1], "a", later)
        lease_table.release(1, "a")
        assert lease_table.read().leases == {0: ("a", later), 1: ("b", soon)}
        lease_table.release(0, "a")
        assert lease_table.read().leases == {1: ("b", soon)}

    def test_members_join_refresh_and_leave(self, lease_table: Any) -> None:
        soon, later = NOW + timedelta(seconds=5), NOW + timedelta(seconds=50)
        lease_table.join("a", soon)
        lease_table.join("b", soon)
        lease_table.join("a", later)
        assert lease_table.read().members == {"a": later, "b": soon}
        lease_table.leave("b")
        lease_table.leave("nobody")
        assert lease_table.read().members == {"a": later}


def _entry(entry_id: str = "e-1") -> dict[str, Any]:
    return {
        "id": entry_id,
        "type": "Added",
        "payload": {"n": 1},
        "created_at": NOW,
        "seq": 1,
        "aggregate_id": "a",
        "aggregate_type": "Counter",
    }


class DeadLettersContract:
    """Behaviour every dead-letter store must show: ``put`` is idempotent by entry ID."""

    def test_put_is_idempotent_by_entry_id(self, dead_letters: tuple[Any, Any]) -> None:
        port, count = dead_letters
        port.put("a", _entry("e-1"), "refused", 3)
        port.put("a", _entry("e-1"), "refused again", 4)
        port.put("a", _entry("e-2"), "refused", 1)
        assert count() == 2

    def test_a_malformed_entry_is_kept_too(self, dead_letters: tuple[Any, Any]) -> None:
        port, count = dead_letters
        port.put("a", {"value": "'garbage'"}, "malformed entry", 0)
        assert count() == 1

    def test_it_tells_the_sweep_which_payloads_its_dead_letters_refer_to(
        self, dead_letters: tuple[Any, Any]
    ) -> None:
        port, _ = dead_letters
        claimed = {k: v for k, v in _entry("e-1").items() if k != "payload"}
        claimed["claim"] = {"id": "p-1", "size": 12, "encoded": False}
        port.put("a", claimed, "refused", 1)
        port.put("a", _entry("e-2"), "refused", 1)
        assert port.refers_to("p-1") is True
        assert port.refers_to("p-2") is False


class PublisherContract:
    """Behaviour every publisher must show, on its real broker: an accepted entry is
    received, in order.

    The fixture ``publisher`` is a ``(port, received)`` pair: entries whose
    ``destination`` is ``"d"`` go where ``received()`` reads back, from the broker itself,
    the IDs of the entries it accepted so far, in order.
    """

    def test_accepted_entries_are_received_in_order(self, publisher: tuple[Any, Any]) -> None:
        port, received = publisher
        entries = [_fresh(f"p-{i}", i + 1, "d") for i in range(5)]
        for entry in entries:
            port.publish(entry)
        _wait_for(received, len(entries))
        assert received() == [e.id for e in entries]


class BrokerPublisherContract(PublisherContract):
    """A publisher in front of a real broker (or store) that can refuse or be away.

    - An entry for a destination the broker does not know (RabbitMQ returns an unroutable
      ``mandatory`` message, Kafka has no such topic, the local publisher has no such
      route) never returns normally, and the publisher keeps working.
    - A broker that cannot be reached raises
      :class:`~docoutbox.errors.BrokerUnavailable`, which never counts against an entry.

    Besides ``publisher``, a subclass provides ``unreachable_publisher``: a publisher of
    the same kind whose broker cannot be reached. A publisher that takes every destination
    and is never away (an in-memory one) runs :class:`PublisherContract` only.
    """

    def test_an_entry_for_an_unknown_destination_raises_and_the_next_one_goes_through(
        self, publisher: tuple[Any, Any]
    ) -> None:
        port, received = publisher
        lost = _fresh("p-lost", 1, _unknown_destination())
        with pytest.raises((PublishError, BrokerUnavailable)):
            port.publish(lost)
        kept = _fresh("p-kept", 2, "d")
        port.publish(kept)
        _wait_for(received, 1)
        assert received() == [kept.id]

    def test_an_unreachable_broker_raises_broker_unavailable(
        self, unreachable_publisher: Any
    ) -> None:
        with pytest.raises(BrokerUnavailable):
            unreachable_publisher.publish(_fresh("p-held", 1, "d"))


def _fresh(entry_id: str, seq: int, destination: str) -> OutboxMessage:
    """An entry created now: a broker may refuse a record timestamp far from its clock
    (Kafka: ``log.message.timestamp.after.max.ms``, one hour ahead by default)."""
    fields = {"seq": seq, "destination": destination, "created_at": utcnow()}
    entry: OutboxMessage = OutboxMessage.parse({**_entry(entry_id), **fields})
    return entry


def _unknown_destination() -> str:
    return f"dx-nowhere-{uuid.uuid4().hex[:10]}"


def _wait_for(received: Callable[[], list[str]], count: int, timeout: float = 15.0) -> None:
    """Poll ``received()`` until it holds ``count`` IDs (a broker delivers asynchronously)."""
    deadline = time.monotonic() + timeout
    while len(received()) < count:
        assert time.monotonic() < deadline, received()
        time.sleep(0.02)
