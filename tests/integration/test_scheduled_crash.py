"""kill -9 a leased dispatcher while scheduled messages fall due (MongoDB, Cosmos DB).

Two leased ``docoutbox dispatch`` processes share the partitions (MongoDB) or the feed
ranges (Cosmos DB); messages are scheduled to fall due over several seconds, and an
instance holding leases is killed with SIGKILL in the middle of that window. The other
takes its share over once the leases expire (one TTL) and publishes what fell due
meanwhile. Checked, on what the broker delivered: every scheduled message arrives, none
before its due time, each within the documented bound plus the takeover (generous for
a loaded machine; the measured latencies are printed); a cancelled one never arrives; a
message arrives twice only if the kill left it released but not trimmed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pika
import pytest

from benchmarks.rabbit import Sandbox
from benchmarks.servers import CosmosAccount
from docoutbox import AggregateStore, Decision, Message, emit
from docoutbox.codec import decode_entry
from docoutbox.store.document import utcnow
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from docoutbox_mongo import MongoBackend
from docoutbox_rabbitmq import RabbitPublisher
from tests.integration.test_cosmos_crash import LEASE_TTL, Instance, _leases
from tests.integration.test_crash import TTL, DispatcherProcess, LeaseWatch
from tests.support.cosmos import create_container, scratch_database
from tests.unit.test_scheduled import Timer, handlers, msg

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow, pytest.mark.timeout(300)]

MESSAGES = 30
#: Due times spread over this window, starting a little after the writes.
WINDOW = 8.0
# How late a message may arrive: the documented bound (due_interval + a query + a
# publish, about 2 s) plus the takeover (one lease TTL), with room for a loaded machine.


class Receiver:
    """Takes every message off ``queue`` and notes when it arrived."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.arrivals: list[tuple[str, datetime]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        try:
            while not self._stop.is_set():
                method, _, body = channel.basic_get(self.queue, auto_ack=True)
                if method is None:
                    time.sleep(0.01)
                    continue
                self.arrivals.append((decode_entry(body).id, utcnow()))
        finally:
            connection.close()

    def ids(self) -> set[str]:
        return {entry_id for entry_id, _ in self.arrivals}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Scenario:
    """Schedule, kill, collect: what the MongoDB and Cosmos DB variants share."""

    def __init__(self, store: AggregateStore[Timer], receiver: Receiver, late: timedelta) -> None:
        self.store, self.receiver, self.late = store, receiver, late
        self.due: dict[str, datetime] = {}
        self.start = utcnow()
        self.cancelled = ""

    def schedule(self) -> None:
        """MESSAGES messages due over WINDOW seconds from 2 s on, and one cancelled."""
        self.start = utcnow() + timedelta(seconds=2)
        for i in range(MESSAGES):
            at = self.start + timedelta(seconds=WINDOW * i / MESSAGES)

            def schedule(state: Timer, message: Message, *, at: datetime = at) -> Decision[Timer]:
                return Decision(state, emit("Timeout", deliver_at=at, key="t"))

            outcome = self.store.handle(f"a{i}", msg(f"s{i}", "Schedule"), schedule, create=True)
            [entry] = outcome.entries
            self.due[entry["id"]] = entry["due"]
        start_x = msg("s", "Start", after=WINDOW / 2, key="k")
        [doomed] = self.store.handle("x", start_x, handlers, create=True).entries
        self.cancelled = doomed["id"]
        assert self.store.handle("x", msg("c", "Stop", key="k"), handlers).cancelled == ("k",)

    def halfway(self) -> None:
        time.sleep(max(0.0, (self.start - utcnow()).total_seconds() + WINDOW / 2))

    def wait_all(self) -> None:
        deadline = time.monotonic() + 90
        while not set(self.due) <= self.receiver.ids():
            assert time.monotonic() < deadline, f"missing {set(self.due) - self.receiver.ids()}"
            time.sleep(0.05)
        time.sleep(1.0)  # a late duplicate or a cancelled message would show by now

    def check(self, name: str) -> None:
        late: list[float] = []
        for entry_id, arrived in self.receiver.arrivals:
            if entry_id not in self.due:
                continue
            due = self.due[entry_id]
            assert arrived >= due, f"{entry_id} arrived before it was due"
            assert arrived <= due + self.late, f"{entry_id} arrived late: {arrived}"
            late.append((arrived - due).total_seconds())
        assert self.cancelled not in self.receiver.ids()
        counts = Counter(entry_id for entry_id, _ in self.receiver.arrivals)
        again = sum(n - 1 for n in counts.values())
        # A message arrives twice only if the kill came between its publish and its trim.
        assert again <= 4, counts
        print(
            f"\nscheduled kill -9 ({name}): {len(self.due)} messages, latency max "
            f"{max(late):.2f} s, median {sorted(late)[len(late) // 2]:.2f} s, "
            f"duplicates {again}"
        )


def receiving(box: Sandbox) -> tuple[str, Receiver]:
    exchange, queue, _ = box.names()
    with RabbitPublisher(box.url, exchange) as setup:
        setup.declare(queues={queue: ["#"]})
    return exchange, Receiver(box.url, queue)


@pytest.mark.wire
def test_kill_9_while_scheduled_messages_fall_due_on_mongodb(
    mongo_uri: str, mongo: Any, box: Sandbox
) -> None:
    exchange, receiver = receiving(box)
    backend = MongoBackend(mongo["producers"])
    backend.ensure_indexes()
    scenario = Scenario(AggregateStore(backend, Timer), receiver, timedelta(seconds=2 + TTL + 10))
    watch = LeaseWatch(mongo["docoutbox_leases"])
    fleet = [
        DispatcherProcess(mongo_uri, mongo.name, box.url, exchange, "INFO", leased=True)
        for _ in range(2)
    ]
    try:
        for instance in fleet:
            instance.wait_started()
        scenario.schedule()
        scenario.halfway()
        victim = max(fleet, key=lambda p: len(watch.held_by(p.proc.pid)[0]))
        assert watch.held_by(victim.proc.pid)[0], "the victim holds no lease"
        victim.kill()
        assert victim.proc.returncode == -9
        scenario.wait_all()
    finally:
        receiver.stop()
        watch.stop()
        for instance in fleet:
            instance.close()
    scenario.check("MongoDB")


@pytest.mark.cosmos
def test_kill_9_while_scheduled_messages_fall_due_on_cosmos(
    cosmos_server: CosmosAccount, box: Sandbox
) -> None:
    exchange, receiver = receiving(box)
    with scratch_database(cosmos_server) as database:
        backend = CosmosBackend(create_container(database, "producers"))
        late = timedelta(seconds=2 + LEASE_TTL + 10)
        scenario = Scenario(AggregateStore(backend, Timer), receiver, late)
        leases = CosmosFeedRangeLeases(
            database.get_container_client("docoutbox_leases"),
            database.get_container_client("producers"),
            "producers",
        )
        fleet = [Instance(cosmos_server, database.id, box.url, exchange) for _ in range(2)]
        try:
            for instance in fleet:
                instance.wait_started()
            deadline = time.monotonic() + 6 * LEASE_TTL
            while len({owner for owner, _ in _leases(leases).values()}) < 2:  # ranges split
                assert time.monotonic() < deadline, [i.output() for i in fleet]
                time.sleep(0.1)
            scenario.schedule()
            scenario.halfway()
            fleet[0].kill()
            assert fleet[0].proc.returncode == -9
            scenario.wait_all()
        finally:
            receiver.stop()
            for instance in fleet:
                instance.close()
    scenario.check("Cosmos DB")
