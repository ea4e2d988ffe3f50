"""A Kafka consumer process for the crash test: ledgers in MongoDB, one JSON line per record.

    python -m tests.support.kafka_receiver --bootstrap B --topic T --group G --dead D \\
        --mongo-uri U --db DB --log FILE

Runs :class:`~docoutbox_kafka.KafkaConsumer` into :class:`~benchmarks.ledger.Ledger`
aggregates (exact de-duplication) until SIGTERM, then commits and exits 0. Each settled
record is appended to FILE as ``{"id", "source", "seq", "action", "duplicate",
"partition", "offset"}`` and flushed, so a test can follow progress and tell a record
read again (same offset) from a re-published message (another offset). It joins the
group with a static ``group.instance.id``, so an instance restarted after ``kill -9``
takes over its partitions at once instead of after the session timeout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from pymongo import MongoClient

from benchmarks.ledger import Ledger, by_source, ledger_handlers
from docoutbox import AggregateStore
from docoutbox.receive import Verdict
from docoutbox_kafka import KafkaConsumer
from docoutbox_mongo import MongoBackend
from tests.support.traffic import RECEIVER_CONFIG


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kafka_receiver")
    for name in ("bootstrap", "topic", "group", "dead", "mongo-uri", "db", "log"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    client: Any = MongoClient(args.mongo_uri, uuidRepresentation="standard")
    store = AggregateStore(MongoBackend(client[args.db]["ledgers"]), Ledger, RECEIVER_CONFIG)
    log = open(args.log, "a", encoding="utf-8")  # noqa: SIM115 - closed at exit

    def record(verdict: Verdict, kafka_record: Any) -> None:
        message, outcome = verdict.message, verdict.outcome
        line = {
            "id": message.id if message else None,
            "source": message.source if message else None,
            "seq": message.seq if message else None,
            "action": str(verdict.action),
            "duplicate": bool(outcome is not None and outcome.duplicate),
            "partition": kafka_record.partition(),
            "offset": kafka_record.offset(),
        }
        log.write(json.dumps(line) + "\n")
        log.flush()

    consumer = KafkaConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.instance.id": f"{args.group}-receiver",
            "session.timeout.ms": 6000,
        },
        args.topic,
        args.group,
        store,
        ledger_handlers,
        aggregate_id_of=by_source,
        dead_letter_topic=args.dead,
        create=True,
        on_verdict=record,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("receiver_started", flush=True)
    try:
        consumer.run(stop=stop, poll=0.05)
    finally:
        consumer.close()
        log.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
