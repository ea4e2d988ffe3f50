"""Kafka for the tests: where the broker is, and uniquely named topics deleted afterwards.

The broker is started by ``scripts/servers.sh start-kafka`` (single node, KRaft) on
127.0.0.1:19092, or reached through ``DOCOUTBOX_KAFKA_BOOTSTRAP``. confluent-kafka is
imported lazily.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

DEFAULT_KAFKA_PORT = 19092
KAFKA_BOOTSTRAP_ENV = "DOCOUTBOX_KAFKA_BOOTSTRAP"


def kafka_port() -> int:
    return int(os.environ.get("DOCOUTBOX_KAFKA_PORT") or DEFAULT_KAFKA_PORT)


def kafka_bootstrap() -> str:
    """``$DOCOUTBOX_KAFKA_BOOTSTRAP`` or the broker of ``scripts/servers.sh start-kafka``."""
    return os.environ.get(KAFKA_BOOTSTRAP_ENV) or f"127.0.0.1:{kafka_port()}"


def proxied_ports() -> tuple[int, int]:
    """(the broker's PROXIED listener, the port it advertises): a test proxy joins them."""
    return kafka_port() + 2, kafka_port() + 3


def kafka_available(bootstrap: str, timeout: float = 5.0) -> str | None:
    """Return None when the cluster answers a metadata request, else the reason."""
    try:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return "confluent-kafka is not installed"
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        return f"Kafka not reachable at {bootstrap}: {exc}"
    return None


def require_kafka() -> str:
    """The bootstrap servers; skips (or fails under DOCOUTBOX_REQUIRE_SERVERS=1) if absent."""
    from tests.conftest import missing

    bootstrap = kafka_bootstrap()
    reason = kafka_available(bootstrap)
    if reason:
        missing(f"{reason}; run scripts/servers.sh install-kafka start-kafka")
    return bootstrap


class Topics:
    """Uniquely named topics on a real cluster, deleted by :meth:`close`."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.names: list[str] = []

    def create(self, prefix: str = "dx-topic", partitions: int = 1) -> str:
        from confluent_kafka.admin import NewTopic

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        for future in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)
        self.names.append(name)
        self._wait_for_leaders(name, partitions)
        return name

    def _wait_for_leaders(self, name: str, partitions: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            topic = self.admin.list_topics(name, timeout=10).topics.get(name)
            leaders = [] if topic is None else [p.leader for p in topic.partitions.values()]
            if len(leaders) == partitions and min(leaders) >= 0:
                return
            assert time.monotonic() < deadline, f"topic {name} has no leaders"
            time.sleep(0.05)

    def read(self, topic: str, count: int, timeout: float = 15.0) -> list[Any]:
        """The first ``count`` records of ``topic`` (every partition, from the start)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"dx-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
            records: list[Any] = []
            deadline = time.monotonic() + timeout
            while len(records) < count and time.monotonic() < deadline:
                record = consumer.poll(0.2)
                if record is not None and record.error() is None:
                    records.append(record)
            return records
        finally:
            consumer.close()

    def size(self, topic: str) -> int:
        """How many records ``topic`` holds (the sum of its partitions' high watermarks)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "dx-size"})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            return sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in meta.partitions
            )
        finally:
            consumer.close()

    def committed(self, topic: str, group: str) -> dict[int, int]:
        """The group's committed offset per partition (-1001 when none)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            parts = consumer.committed(
                [TopicPartition(topic, p) for p in meta.partitions], timeout=10
            )
            return {tp.partition: tp.offset for tp in parts}
        finally:
            consumer.close()

    def committed_total(self, topic: str, group: str) -> int:
        """How many records of ``topic`` the group has committed past, over all partitions."""
        return sum(max(offset, 0) for offset in self.committed(topic, group).values())

    def close(self) -> None:
        if self.names:
            for future in self.admin.delete_topics(self.names).values():
                future.result(timeout=30)
            self.names = []
