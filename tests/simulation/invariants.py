"""What must hold once a schedule is quiescent, checked against what actually happened.

The simulator records the ground truth as it performs operations (:class:`Record`): the
commands the clients sent, every outbox entry a producer write stored, every message the
broker accepted and every quarantine. The final documents are read straight from the
store. The checks:

- ``command-once``: each command's effect is in its producer's state exactly once, and
  its emitted messages were stored exactly once (no lost update, no double apply).
- ``seq``: each producer's entries are numbered 1..outbox_seq without gaps, one entry per
  number, and each entry at most once: immediate ones when stored, scheduled ones when
  released (a cancelled one never).
- ``seq-published``: per producer, the seqs published (or quarantined) are exactly
  1..outbox_seq, each carried by one entry only: an exact receiver's mark compacts.
- ``published`` (I1): every stored entry was published at least once, or quarantined.
- ``order`` (I4): per producer, the *first* publication of entry n comes after the first
  publication (or the quarantine) of every entry before it, scheduled entries included
  (numbered when released). Re-publications after a crash repeat a prefix, so later
  publications may be out of order; first ones may not.
- ``consumed-once``: every stored entry was processed by its consumer exactly once (at
  most once if quarantined), and consumers processed nothing else.
- ``dead-letters``: only stored entries are quarantined.
- ``drained``: every outbox is empty at the end.

Scheduled entries (checked as they happen, by the world): ``scheduled-early``, never
published before due; ``cancelled``, never published once their cancellation committed.
A cancelled entry need not be published (``published``, ``consumed-once``) and never
gets a seq.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from docoutbox.model import OutboxMessage
from docoutbox.store.document import Document
from docoutbox.stored import StoredValues
from tests.simulation.actors import Command
from tests.simulation.schedule import CODEC


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


@dataclass
class Record:
    """The ground truth of one run, written by the simulator as it performs operations."""

    commands: list[Command] = field(default_factory=list)
    #: Every outbox entry that a successful producer write stored, in write order.
    stored: list[dict[str, Any]] = field(default_factory=list)
    #: (event number, entry) for every message the broker accepted.
    publications: list[tuple[int, OutboxMessage]] = field(default_factory=list)
    #: Entry ID -> event number of its first quarantine.
    quarantined: dict[str, int] = field(default_factory=dict)
    #: Entry ID -> event number of the commit that cancelled it.
    cancelled: dict[str, int] = field(default_factory=dict)
    #: Entry ID -> the seqs it was given (when stored, or when released), in order.
    numbered: dict[str, list[int]] = field(default_factory=dict)
    events: int = 0
    #: Violations seen while running (checkpoint checks, unexpected errors, liveness).
    violations: list[Violation] = field(default_factory=list)

    def number(self, entries: Iterable[dict[str, Any]]) -> None:
        for entry in entries:
            if entry.get("seq") is not None:
                self.numbered.setdefault(str(entry["id"]), []).append(int(entry["seq"]))

    def seq_of(self, entry_id: str) -> int | None:
        seqs = self.numbered.get(entry_id)
        return seqs[-1] if seqs else None

    def tick(self) -> int:
        self.events += 1
        return self.events


Docs = Mapping[str, Document | None]


def check(record: Record, producers: Docs, sinks: Docs) -> list[Violation]:
    return [
        *command_once(record, producers),
        *seq_gap_free(record, producers),
        *seq_published(record, producers),
        *published(record),
        *publish_order(record),
        *consumed_once(record, sinks),
        *dead_letters(record),
        *drained(producers),
    ]


def _state(doc: Document | None, key: str) -> list[str]:
    if doc is None:
        return []
    return list(StoredValues(CODEC).open_state(str(doc.get("type")), doc)[key])


def command_once(record: Record, producers: Docs) -> Iterator[Violation]:
    by_cause: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in record.stored:
        by_cause[str(entry["causation_id"])].append(entry)
    issued = {c.message.id for c in record.commands}
    for pid, doc in producers.items():
        for cid in dict.fromkeys(_state(doc, "applied")):
            if cid not in issued:
                yield Violation("command-once", f"{pid} applied {cid}, which no client sent")
    for command in record.commands:
        cid, pid = command.message.id, command.aggregate_id
        n = _state(producers.get(pid), "applied").count(cid)
        if n != 1:
            yield Violation("command-once", f"{cid} is applied {n} times in {pid}'s state")
        dests = sorted(str(e["destination"]) for e in by_cause.pop(cid, []))
        if dests != sorted(command.targets):
            yield Violation(
                "command-once",
                f"{cid} should emit to {sorted(command.targets)}; stored entries go to {dests}",
            )
    for cid in by_cause:
        yield Violation("command-once", f"entries caused by unknown message {cid} were stored")
    for entry_id, n in Counter(str(e["id"]) for e in record.stored).items():
        if n > 1:
            yield Violation("command-once", f"entry id {entry_id} was stored {n} times")


def seq_gap_free(record: Record, producers: Docs) -> Iterator[Violation]:
    seqs: defaultdict[str, list[int]] = defaultdict(list)
    for entry in record.stored:
        entry_id = str(entry["id"])
        given = record.numbered.get(entry_id, [])
        if len(given) > 1:
            yield Violation("seq", f"{entry_id} was numbered {given}")
        if given and entry_id in record.cancelled:
            yield Violation("seq", f"{entry_id} was cancelled and numbered {given}")
        seqs[str(entry["aggregate_id"])].extend(given)
    for pid, doc in producers.items():
        last = int(doc["outbox_seq"]) if doc is not None else 0
        if sorted(seqs[pid]) != list(range(1, last + 1)):
            yield Violation("seq", f"{pid}: numbered seqs {sorted(seqs[pid])}, outbox_seq {last}")


def seq_published(record: Record, producers: Docs) -> Iterator[Violation]:
    carried: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    for _, message in record.publications:
        if message.seq is not None:
            carried[(str(message.aggregate_id), message.seq)].add(message.id)
    for entry in record.stored:
        seq = record.seq_of(str(entry["id"]))
        if str(entry["id"]) in record.quarantined and seq is not None:
            carried[(str(entry["aggregate_id"]), seq)].add(str(entry["id"]))
    for (pid, seq), ids in sorted(carried.items()):
        if len(ids) > 1:
            yield Violation("seq-published", f"{pid} seq {seq} was published for {sorted(ids)}")
    for pid, doc in producers.items():
        last = int(doc["outbox_seq"]) if doc is not None else 0
        out = sorted(seq for p, seq in carried if p == pid)
        if out != list(range(1, last + 1)):
            yield Violation("seq-published", f"{pid}: published seqs {out}, outbox_seq {last}")


def published(record: Record) -> Iterator[Violation]:
    out = {p.id for _, p in record.publications} | set(record.quarantined)
    out |= set(record.cancelled)
    for entry in record.stored:
        if entry["id"] not in out:
            yield Violation(
                "published",
                f"{entry['aggregate_id']} seq {entry.get('seq')} ({entry['id']}) was never "
                "published nor quarantined",
            )


def publish_order(record: Record) -> Iterator[Violation]:
    first: dict[tuple[str, int], int] = {}
    for event, message in record.publications:
        if message.seq is not None:
            first.setdefault((str(message.aggregate_id), message.seq), event)
    gone = dict(first)
    for entry in record.stored:
        seq = record.seq_of(str(entry["id"]))
        if str(entry["id"]) in record.quarantined and seq is not None:
            key = (str(entry["aggregate_id"]), seq)
            gone[key] = min(gone.get(key, 1 << 62), record.quarantined[str(entry["id"])])
    for (pid, seq), event in sorted(first.items()):
        for before in range(1, seq):
            at = gone.get((pid, before))
            if at is None or at > event:
                yield Violation(
                    "order",
                    f"{pid} seq {seq} was first published (event {event}) before seq "
                    f"{before} was published or quarantined (event {at})",
                )
                break


def consumed_once(record: Record, sinks: Docs) -> Iterator[Violation]:
    seen = {sid: Counter(_state(doc, "seen")) for sid, doc in sinks.items()}
    published_ids = {message.id for _, message in record.publications}
    expected: set[tuple[str, str]] = set()
    for entry in record.stored:
        sid, eid = str(entry["destination"]), str(entry["id"])
        expected.add((sid, eid))
        n = seen.get(sid, Counter())[eid]
        allowed = (0, 1) if eid in record.quarantined else (1,)
        if eid in record.cancelled and eid not in published_ids:
            allowed = (0,)
        if n not in allowed:
            yield Violation(
                "consumed-once",
                f"{entry['aggregate_id']} seq {entry.get('seq')} ({eid}) was processed {n} times "
                f"by {sid}" + (" (quarantined)" if eid in record.quarantined else ""),
            )
    for sid, counts in seen.items():
        for eid in counts:
            if (sid, eid) not in expected:
                yield Violation("consumed-once", f"{sid} processed {eid}, which was never stored")


def dead_letters(record: Record) -> Iterator[Violation]:
    stored = {str(e["id"]) for e in record.stored}
    for eid in record.quarantined:
        if eid not in stored:
            yield Violation("dead-letters", f"{eid} was quarantined but never stored")


def drained(producers: Docs) -> Iterator[Violation]:
    for pid, doc in producers.items():
        if doc is not None and doc.get("outbox"):
            seqs = [e.get("seq") for e in doc["outbox"]]
            yield Violation("drained", f"{pid} still has pending entries {seqs}")
