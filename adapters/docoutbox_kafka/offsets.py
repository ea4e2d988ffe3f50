"""Which offsets a Kafka consumer may commit, and where it must rewind. No I/O.

Rule: a partition's committed offset never passes a record that was neither handled
(committed to the store, or recognized as a duplicate) nor kept in the dead letters.
Shared by :class:`~docoutbox_kafka.KafkaConsumer` and
:class:`~docoutbox_kafka.aio.AsyncKafkaConsumer`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from docoutbox.receive import Action, Verdict

Key = tuple[str, int]


class Record(Protocol):
    """What is read of a confluent-kafka ``Message``."""

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...


def key_of(record: Record) -> Key:
    return (str(record.topic()), int(record.partition() or 0))


@dataclass
class Settled:
    """What settling a poll's verdicts asks of the shell."""

    #: Partitions to rewind, to the first record not settled.
    rewind: list[tuple[str, int, int]] = field(default_factory=list)
    #: Per record (in order), whether this consumer had read it before.
    redelivered: list[bool] = field(default_factory=list)
    #: The error to raise once the settled offsets are committed: a permanent store error,
    #: or a dead-letter write that failed.
    error: BaseException | None = None


class Offsets:
    """Per partition: the next offset to commit, what was committed, read and rewound."""

    def __init__(self, commit_every: int, commit_interval: float) -> None:
        self.commit_every = commit_every
        self.commit_interval = commit_interval
        #: Per partition, the next offset to commit (every record before it is settled).
        self.done: dict[Key, int] = {}
        self.committed: dict[Key, int] = {}
        self.seen: dict[Key, int] = {}
        #: Per partition rewound, the offset it was rewound to: records after it that were
        #: fetched before the rewind are skipped until it comes again.
        self.rewound: dict[Key, int] = {}
        self.since_commit = 0
        self.committed_at = time.monotonic()

    def fresh(self, record: Record) -> bool:
        """False for a record after a rewound offset, fetched before the rewind."""
        key = key_of(record)
        rewound = self.rewound.get(key)
        if rewound is None:
            return True
        if record.offset() == rewound:
            del self.rewound[key]
            return True
        return False

    def settle(self, records: Sequence[Record], verdicts: Sequence[Verdict]) -> Settled:
        """Advance each partition past its records settled in order; rewind it to the first
        record that is to be read again (a requeue, or a reject not kept)."""
        settled = Settled()
        blocked: set[Key] = set()
        for record, verdict in zip(records, verdicts, strict=True):
            key, offset = key_of(record), int(record.offset() or 0)
            settled.redelivered.append(offset <= self.seen.get(key, -1))
            self.seen[key] = max(offset, self.seen.get(key, -1))
            if key in blocked:
                continue
            if verdict.action is Action.REQUEUE:
                blocked.add(key)
                settled.rewind.append((key[0], key[1], offset))
                self.rewound[key] = offset
                error = verdict.keep_error or (verdict.error if verdict.fatal else None)
                if settled.error is None and error is not None:
                    settled.error = error
                continue
            self.done[key] = offset + 1
            self.since_commit += 1
        return settled

    def to_commit(self) -> list[tuple[str, int, int]]:
        return [
            (topic, partition, offset)
            for (topic, partition), offset in self.done.items()
            if self.committed.get((topic, partition)) != offset
        ]

    def mark_committed(self, offsets: Iterable[tuple[str, int, int]]) -> None:
        for topic, partition, offset in offsets:
            self.committed[(topic, partition)] = offset
        self.since_commit = 0
        self.committed_at = time.monotonic()

    def due(self) -> bool:
        return self.since_commit >= self.commit_every or bool(
            self.since_commit and time.monotonic() - self.committed_at >= self.commit_interval
        )

    def forget(self, partitions: Iterable[Any]) -> None:
        """Forget partitions handed to another member (``TopicPartition``s)."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            for table in (self.done, self.committed, self.seen, self.rewound):
                table.pop(key, None)
