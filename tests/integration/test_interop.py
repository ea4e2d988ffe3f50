"""Consumers written in another language read what the dispatcher published.

The real :class:`~docoutbox.Dispatcher` (over the in-memory store and its change log)
publishes producers' entries through ``RabbitPublisher`` or ``KafkaPublisher`` in each
wire format; ``tests/interop/consume.js`` reads them with Node's ``amqplib`` or
``kafkajs``, tells the format apart, and validates every message against the JSON Schema
shipped in the package (``docoutbox/schema``) with ``ajv``.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
import time
from importlib import resources
from typing import Any

import pytest

from docoutbox import AggregateStore, Dispatcher, DispatcherConfig
from docoutbox.codec import WireFormat
from docoutbox.testing import MemoryBackend, MemoryDeadLetters
from docoutbox.testing.contract import Counter
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints
from docoutbox_kafka import KafkaPublisher
from docoutbox_rabbitmq import RabbitPublisher
from tests.conftest import missing
from tests.support.servers import REPO_ROOT
from tests.support.traffic import Producers

INTEROP = REPO_ROOT / "tests" / "interop"
PRODUCERS, COMMANDS, EMITS = 5, 3, 2


@pytest.fixture(scope="module")
def node() -> str:
    found = shutil.which("node")
    if found is None:
        missing("node (Node.js 18+) is not on PATH")
    if not (INTEROP / "node_modules" / "kafkajs").is_dir():
        missing("tests/interop/node_modules is missing; run scripts/setup (npm ci)")
    return str(found)


def dispatch(publisher: Any) -> dict[str, list[int]]:
    """Commit commands on producers, dispatch every entry once; the seqs per aggregate."""
    backend = MemoryBackend()
    store = AggregateStore(backend, Counter)
    ids = [f"p{i}" for i in range(PRODUCERS)]
    producers = Producers(store, ids, random.Random(7), emits=EMITS)
    producers.run_commands(COMMANDS)
    dispatcher = Dispatcher(
        backend,
        publisher,
        MemoryDeadLetters(),
        source=MemoryChangeSource(backend),
        checkpoints=MemoryCheckpoints(),
        config=DispatcherConfig(name="interop", poll_interval=0.01),
    )
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while producers.pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    dispatcher.stop()
    thread.join(timeout=30)
    assert producers.pending() == {}
    return {i: list(range(1, COMMANDS * EMITS + 1)) for i in ids}


def consume(node: str, kind: str, address: str, source: str, count: int) -> list[dict[str, Any]]:
    schemas = str(resources.files("docoutbox").joinpath("schema"))
    done = subprocess.run(
        [node, "consume.js", kind, address, source, str(count), schemas],
        cwd=INTEROP,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def check(lines: list[dict[str, Any]], wire: WireFormat, expected: dict[str, list[int]]) -> None:
    assert [line for line in lines if not line["valid"]] == []
    assert {line["mode"] for line in lines} == {str(wire)}
    assert {line["type"] for line in lines} == {"Added"}
    assert len({line["id"] for line in lines}) == len(lines)
    seqs: dict[str, list[int]] = {}
    for line in lines:
        seqs.setdefault(line["aggregate"], []).append(line["seq"])
    assert seqs == expected  # every entry once, each aggregate's in seq order


@pytest.mark.rabbitmq
@pytest.mark.parametrize("wire", list(WireFormat))
def test_node_amqplib_reads_and_validates_what_was_dispatched(
    node: str, box: Any, wire: WireFormat
) -> None:
    exchange, queue, _ = box.names()
    with RabbitPublisher(box.url, exchange, wire=wire) as publisher:
        publisher.declare(queues={queue: ["#"]})
        expected = dispatch(publisher)
    lines = consume(node, "amqp", box.url, queue, PRODUCERS * COMMANDS * EMITS)
    check(lines, wire, expected)


@pytest.mark.kafka
@pytest.mark.parametrize("wire", list(WireFormat))
def test_node_kafkajs_reads_and_validates_what_was_dispatched(
    node: str, topics: Any, wire: WireFormat
) -> None:
    topic = topics.create(partitions=2)
    with KafkaPublisher(topics.bootstrap, topic, wire=wire) as publisher:
        expected = dispatch(publisher)
    lines = consume(node, "kafka", topics.bootstrap, topic, PRODUCERS * COMMANDS * EMITS)
    check(lines, wire, expected)
    assert all(line["key"] == line["aggregate"] for line in lines)
