"""The stored document layout, shared by every store.

::

    { _id, type, version, partition, state: {...},
      inbox: ["msg-id", ...],                          newest last, bounded
      inbox_marks: [{source, hw, above: [...]}, ...],  exact de-duplication
      inbox_spill?: {count, token},                    the inbox spilled (spill.py)
      outbox: [{id, type, payload, headers, created_at, seq, aggregate_id, ...,
                due?, key?, released?}],                scheduled entries: see schedule.py
      outbox_seq, created_at, updated_at,
      earliest_due?, cancelled?: ["entry-id", ...],
      state_version? }                                 only for versioned models

With a codec (:mod:`docoutbox.stored`), ``state`` and each entry's ``payload`` and
``headers`` hold encoded strings instead of objects; nothing else changes.

Business state lives under one key so that "set the state" is a single operation on
every store (a Cosmos patch allows at most 10 operations).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from docoutbox.errors import InvalidConfig, MalformedDocument, UnknownCodec
from docoutbox.model import AggregateId, OutboxMessage, with_article
from docoutbox.store.inbox import Mark
from docoutbox.stored.values import StoredValues, open_entry

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")
Document = dict[str, Any]

ID = "_id"
#: Where a change source may put an opaque tag of the stored copy an event's document is
#: (Cosmos DB: the item's ``_etag``). Only trims use it, as a hint
#: (:attr:`~docoutbox.store.plans.TrimPlan.revision`); it is never stored.
REVISION = "_revision"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utcnow() -> datetime:
    """Now, in UTC, truncated to milliseconds (the precision every store keeps)."""
    millis = time.time_ns() // 1_000_000
    if 0 <= millis < _FLOAT_EXACT_MILLIS:  # from_millis(millis), one call fewer per commit
        return datetime.fromtimestamp(millis / 1000, UTC)
    return from_millis(millis)


#: Up to here (2**32 seconds, the year 2106) ``millis / 1000`` is within half a
#: microsecond of the exact time.
_FLOAT_EXACT_MILLIS = 2**32 * 1000


def from_millis(millis: int) -> datetime:
    """The UTC time ``millis`` milliseconds after the epoch, exactly.

    Before the year 2106, ``fromtimestamp(millis / 1000)`` is exact (the float is within
    half a microsecond, and ``fromtimestamp`` rounds to the nearest one) and takes a third
    of the time of adding a ``timedelta`` to the epoch; after, the ``timedelta`` is used.
    """
    if 0 <= millis < _FLOAT_EXACT_MILLIS:
        return datetime.fromtimestamp(millis / 1000, UTC)
    return _EPOCH + timedelta(milliseconds=millis)


def fast_frozen(cls: type[T], **fields: Any) -> T:
    """An instance of the frozen dataclass ``cls`` with every field given, built without
    its field-by-field ``object.__setattr__`` (several microseconds on the hot path).
    The result is the same object ``cls(**fields)`` would make."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


def partition_of(aggregate_id: AggregateId, partitions: int) -> int:
    """A stable partition number in ``range(partitions)`` for dispatcher ownership."""
    if type(partitions) is not int or partitions < 1:
        raise InvalidConfig(f"partitions must be an int >= 1, got {partitions!r}")
    key = f"{type(aggregate_id).__name__}:{aggregate_id}".encode()
    return zlib.crc32(key) % partitions


def new_document(
    aggregate_id: AggregateId,
    aggregate_type: str,
    state: dict[str, Any],
    partition: int,
    now: datetime,
) -> Document:
    return {
        ID: aggregate_id,
        "type": aggregate_type,
        "version": 0,
        "partition": partition,
        "state": state,
        "inbox": [],
        "inbox_marks": [],
        "outbox": [],
        "outbox_seq": 0,
        "created_at": now,
        "updated_at": now,
    }


@dataclass(frozen=True)
class Snapshot(Generic[S]):
    """One aggregate as read from its document."""

    aggregate_id: AggregateId
    aggregate_type: str
    version: int
    state: S
    inbox: tuple[str, ...]
    marks: dict[str, Mark]
    outbox_seq: int
    partition: int
    updated_at: datetime | None
    #: The entries as stored (encoded, with a codec).
    raw_outbox: tuple[dict[str, Any], ...] = field(repr=False)
    #: What decodes and upcasts the entries (None: they are plain).
    values: StoredValues | None = field(default=None, repr=False, compare=False)
    #: IDs of scheduled entries cancelled and not yet trimmed.
    cancelled: tuple[str, ...] = ()

    @cached_property
    def outbox(self) -> tuple[OutboxMessage, ...]:
        """The pending entries, in stored order (ascending ``seq``), decoded."""
        values = self.values
        return tuple(OutboxMessage.parse(open_entry(values, e)) for e in self.raw_outbox)


def is_sequence_number(value: Any) -> bool:
    """Whether ``value`` is a sequence number: a plain non-negative int (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def stored_outbox_seq(doc: Document) -> int:
    """The document's ``outbox_seq`` (0 when absent); MalformedDocument if it is not a
    sequence number (``"3"``, ``True``, ``2.5``, ``-1``): entries numbered from it would
    collide or skip, so a commit never reads one by coercion."""
    value = doc.get("outbox_seq", 0)
    if not is_sequence_number(value):
        raise MalformedDocument(
            f"document {doc.get(ID)!r} has outbox_seq {value!r}, not a sequence number "
            "(a non-negative integer)"
        )
    seq: int = value
    return seq


def read_snapshot(
    doc: Document, model: type[S], state: S | None = None, values: StoredValues | None = None
) -> Snapshot[S]:
    """Parse a stored document; raise MalformedDocument if it is not docoutbox's layout.

    ``state``, when given, is ``doc["state"]`` already read as ``model`` (kept by the
    store's cache), and is used as is. ``values`` decodes and upcasts what is stored.
    """
    if state is None and values is not None:
        state = _open_state(doc, model, values)
    outbox_seq = stored_outbox_seq(doc)
    try:
        stored_marks = doc.get("inbox_marks")
        marks = (
            {
                m["source"]: Mark(m["source"], int(m["hw"]), tuple(m.get("above", ())))
                for m in stored_marks
            }
            if stored_marks
            else {}
        )
        snapshot: Snapshot[S] = object.__new__(Snapshot)
        snapshot.__dict__.update(  # fast_frozen(Snapshot, ...) without its call
            aggregate_id=doc[ID],
            aggregate_type=doc["type"],
            version=int(doc["version"]),
            state=(
                # model.model_validate without its Python-level wrapper
                model.__pydantic_validator__.validate_python(doc["state"])
                if state is None
                else state
            ),
            inbox=tuple(doc.get("inbox") or ()),
            marks=marks,
            outbox_seq=outbox_seq,
            partition=int(doc.get("partition", 0)),
            updated_at=doc.get("updated_at"),
            raw_outbox=tuple(doc.get("outbox") or ()),
            values=values,
            cancelled=tuple(doc.get("cancelled") or ()),
        )
        return snapshot
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        if isinstance(doc.get("state"), str):
            raise UnknownCodec(
                f"document {doc.get(ID)!r} holds an encoded state and this store has no "
                "codec: give it the Codec (and keyring) the writer uses"
            ) from exc
        raise MalformedDocument(
            f"document {doc.get(ID)!r} is not {with_article(model.__name__)} aggregate: {exc!r}"
        ) from exc


def _open_state(doc: Document, model: type[S], values: StoredValues) -> S:
    """``doc``'s state decoded, upcast and read as ``model``."""
    try:
        plain = values.open_state(str(doc.get("type")), doc)
        state: S = model.__pydantic_validator__.validate_python(plain)
        return state
    except (KeyError, TypeError, ValidationError) as exc:
        raise MalformedDocument(
            f"document {doc.get(ID)!r} is not {with_article(model.__name__)} aggregate: {exc!r}"
        ) from exc
