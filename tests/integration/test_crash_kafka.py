"""kill -9 the dispatcher and the consumer at random moments, through Kafka.

Producers keep committing on the wire server. The dispatcher runs as ``python -m
docoutbox dispatch --publisher kafka --wire binary`` (CloudEvents binary mode: the
consumer must find the stream position in ``ce_`` headers) and the consumer as ``python -m
tests.support.kafka_receiver`` (a :class:`~docoutbox_kafka.KafkaConsumer` into ledgers in
a second wire server). At least 20 times, the dispatcher, the consumer or both are killed
with SIGKILL after the consumer has made progress, and restarted. Then the last instances
drain and stop on SIGTERM. Checked:

- every message is processed exactly once, in seq order: each ledger holds exactly 1..N;
- nothing is left pending, quarantined or dead-lettered;
- every re-publish (the same message at another offset) is explained by a dispatcher kill
  that left it untrimmed, and their number is bounded as in the RabbitMQ crash test; a
  record read again at the same offset after a consumer kill is a redelivery, recognized
  by the inbox.

``DOCOUTBOX_CRASH_SEED`` replays a run; the seed is printed either way.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, Any

import pytest
from pymongo import MongoClient

from benchmarks.ledger import Ledger
from benchmarks.servers import MongoWireServer, Topics
from docoutbox import AggregateStore
from docoutbox.testing.contract import Counter
from docoutbox_mongo import MongoBackend
from tests.integration.test_crash import CONCURRENCY, RUN_BATCH, TRIM_EVERY, DispatcherProcess
from tests.support.servers import REPO_ROOT
from tests.support.traffic import (
    Delivery,
    Producers,
    ledger_problems,
    republished,
    summary,
    unexplained_republishes,
)

pytestmark = [pytest.mark.wire, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

ROUNDS = 7  # each kills the dispatcher, the consumer and both, in a random order
PRODUCERS = 20


class ReceiverProcess:
    """``python -m tests.support.kafka_receiver`` with its output in a temporary file."""

    def __init__(self, args: list[str]) -> None:
        self.out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.kafka_receiver", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=self.out,
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        assert self.proc.returncode == -9, self.output()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.out.close()


def deliveries(log: Path) -> list[Delivery]:
    """The consumer processes' records, in order; a line cut short by a kill is skipped."""
    out = []
    if not log.exists():
        return out
    for line in log.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        out.append(
            Delivery(
                item["id"],
                item["source"],
                item["seq"],
                False,
                item["action"],
                item["duplicate"],
                (item["partition"], item["offset"]),
            )
        )
    return out


def applied(ledgers: AggregateStore[Ledger], sources: list[str]) -> dict[str, list[int]]:
    out = {}
    for source in sources:
        snapshot = ledgers.load(source)
        out[source] = snapshot.state.seqs.get(source, []) if snapshot is not None else []
    return out


def test_kill_9_dispatcher_and_consumer_loses_nothing_and_applies_once(
    mongo_uri: str, mongo: Any, topics: Topics, tmp_path: Path
) -> None:
    seed = int(os.environ.get("DOCOUTBOX_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\nKafka crash test seed={seed} (DOCOUTBOX_CRASH_SEED replays it)")
    rng = random.Random(seed)
    topic, dead = topics.create(partitions=4), topics.create("dx-dead")
    group = f"dx-crash-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "deliveries.jsonl"
    producers = Producers(
        AggregateStore(MongoBackend(mongo["producers"]), Counter),
        [f"p{i:02d}" for i in range(PRODUCERS)],
        rng,
        emits=3,
    )
    with MongoWireServer() as ledger_server:  # ledgers apart from the producers' oplog
        client: Any = MongoClient(ledger_server.uri, uuidRepresentation="standard")
        ledgers = AggregateStore(MongoBackend(client["crash"]["ledgers"]), Ledger)
        receiver_args = [
            *("--bootstrap", topics.bootstrap, "--topic", topic, "--group", group),
            *("--dead", dead, "--mongo-uri", ledger_server.uri, "--db", "crash"),
            *("--log", str(log)),
        ]

        def dispatcher() -> DispatcherProcess:
            return DispatcherProcess.to_kafka(
                mongo_uri, mongo.name, topics.bootstrap, topic, log_level="INFO", wire="binary"
            )

        started = time.monotonic()
        receiver = ReceiverProcess(receiver_args)
        instance = dispatcher()
        producers.start(threads=2, pause=0.05)  # about 30 commands a second
        pending_at_kill: list[set[str]] = []
        victims: list[str] = []
        try:
            for _ in range(ROUNDS):
                for victim in rng.sample(["dispatcher", "consumer", "both"], 3):
                    before = len(deliveries(log))
                    deadline = time.monotonic() + 20
                    while len(deliveries(log)) == before and time.monotonic() < deadline:
                        time.sleep(0.02)
                    time.sleep(rng.uniform(0, 0.6))
                    if victim in ("dispatcher", "both"):
                        instance.kill()
                        assert instance.proc.returncode == -9, instance.output()
                        instance.close()
                        # What this kill left untrimmed; only these can be published again.
                        pending_at_kill.append(
                            {i for ids in producers.pending().values() for i in ids}
                        )
                    if victim in ("consumer", "both"):
                        receiver.kill()
                        receiver.close()
                    time.sleep(rng.uniform(0, 0.3))
                    if victim in ("dispatcher", "both"):
                        instance = dispatcher()
                    if victim in ("consumer", "both"):
                        receiver = ReceiverProcess(receiver_args)
                    victims.append(victim)
        finally:
            producers.stop()
        try:
            instance.wait_started()
            expected = producers.expected()
            deadline = time.monotonic() + 120
            while True:
                done = applied(ledgers, sorted(expected))
                finished = all(len(done[s]) >= n for s, n in expected.items())
                if (finished and not producers.pending()) or time.monotonic() > deadline:
                    break
                assert receiver.proc.poll() is None, receiver.output()
                time.sleep(0.2)
            assert instance.stop() == 0, instance.output()
            assert receiver.stop() == 0, receiver.output()
        finally:
            instance.close()
            receiver.close()
        elapsed = time.monotonic() - started
        client.close()

    assert ledger_problems(done, expected) == {}
    assert producers.pending() == {}
    assert mongo["docoutbox_dead_letters"].count_documents({}) == 0
    assert topics.size(dead) == 0
    seen = deliveries(log)
    assert {d.action for d in seen} == {"ack"}

    again = republished(seen)
    unexplained = unexplained_republishes(again, pending_at_kill)
    bound = sum(len(pending) for pending in pending_at_kill)
    in_flight_bound = len(pending_at_kill) * CONCURRENCY * RUN_BATCH * TRIM_EVERY
    print(
        "Kafka crash test:",
        summary(
            {
                "seed": seed,
                "dispatcher_kills": len(pending_at_kill),
                "consumer_kills": victims.count("consumer") + victims.count("both"),
                "commands": producers.commands,
                "messages": sum(expected.values()),
                "records_read": len(seen),
                "read_again_duplicates": sum(d.duplicate for d in seen),
                "republished": sum(again.values()),
                "bound_sum_pending_at_kills": bound,
                "seconds": round(elapsed, 1),
            }
        ),
    )
    assert len(victims) >= 20
    assert unexplained == {}, "re-published more often than kills left them pending"
    assert sum(again.values()) <= min(bound, in_flight_bound)
