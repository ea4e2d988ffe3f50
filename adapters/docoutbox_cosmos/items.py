"""Pure translation between docoutbox documents and Cosmos DB items.

Item layout: the document's fields, with

- ``id``: the aggregate ID encoded by :func:`encode_id` (Cosmos item IDs are strings of
  at most 255 characters without ``/ \\ ? #``);
- ``aid``: the aggregate ID as given (a string or an integer), which ``_id`` is rebuilt
  from on reading;
- the partition-key field, when the container is not partitioned on ``/id``;
- datetimes as fixed-width ISO-8601 UTC strings (``2026-01-02T03:04:05.678000Z``), so
  that they compare in time order inside queries.

:func:`encode_id` is reversible (:func:`decode_id`): ``~`` escapes, so
``"a/b"`` -> ``"a~sb"``, ``"a~b"`` -> ``"a~~b"``, and the integer ``7`` -> ``"~n7"``. An
ID whose encoding is over 255 characters is refused with
:class:`~docoutbox.errors.InvalidAggregateId` before any request.

Patch filter predicates cannot take parameters. The ones built here contain only
integers and JSON-escaped ASCII string literals (``json.dumps``), never raw input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

from docoutbox.errors import InvalidAggregateId, InvalidPayload
from docoutbox.model import AggregateId, check_aggregate_id
from docoutbox.store.document import ID, Document
from docoutbox.store.plans import CommitPlan, FailurePlan
from docoutbox.store.schedule import DUE, EARLIEST_DUE

#: The largest item Cosmos DB accepts, in bytes.
MAX_ITEM_BYTES = 2 * 1024 * 1024
#: The most operations one patch request may carry.
MAX_PATCH_OPS = 10
MAX_ITEM_ID = 255
#: Properties the service adds to every item; never part of a docoutbox document.
SYSTEM_FIELDS = frozenset({"id", "aid", "_rid", "_self", "_etag", "_ts", "_attachments", "_lsn"})
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

_ESCAPES = {"~": "~~", "/": "~s", "\\": "~b", "?": "~q", "#": "~h"}
_UNESCAPES = {"~": "~", "s": "/", "b": "\\", "q": "?", "h": "#"}
_ESCAPE_TABLE = str.maketrans(_ESCAPES)
#: What :func:`format_time` writes (from the year 1000 on): parsed without ``strptime``.
_FIXED_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)

Item = dict[str, Any]
PatchOps = list[dict[str, Any]]


def encode_id(aggregate_id: object) -> str:
    """The Cosmos item ID (and default partition-key value) of an aggregate."""
    checked = check_aggregate_id(aggregate_id)
    encoded = f"~n{checked}" if isinstance(checked, int) else checked.translate(_ESCAPE_TABLE)
    if len(encoded) > MAX_ITEM_ID:
        raise InvalidAggregateId(
            f"aggregate id {checked!r} needs {len(encoded)} characters as a Cosmos item id "
            f"(at most {MAX_ITEM_ID})"
        )
    return encoded


def decode_id(item_id: str) -> AggregateId:
    """The aggregate ID that :func:`encode_id` turned into ``item_id``."""
    if item_id.startswith("~n"):
        return int(item_id[2:])
    out: list[str] = []
    chars = iter(item_id)
    for ch in chars:
        if ch == "~":
            nxt = next(chars, "")
            if nxt not in _UNESCAPES:
                raise InvalidAggregateId(f"not an encoded aggregate id: {item_id!r}")
            out.append(_UNESCAPES[nxt])
        else:
            out.append(ch)
    return "".join(out)


def check_partition_value(value: object) -> str:
    """A partition-key value Cosmos accepts, or InvalidAggregateId."""
    if not isinstance(value, str) or not value or len(value) > MAX_ITEM_ID:
        raise InvalidAggregateId(
            f"partition key value must be a string of 1 to {MAX_ITEM_ID} characters: {value!r}"
        )
    if any(ch in _ESCAPES and ch != "~" for ch in value):
        raise InvalidAggregateId(f"partition key value contains / \\ ? or #: {value!r}")
    return value


def format_time(value: datetime) -> str:
    """``value`` in UTC as ``DATE_FORMAT`` (``isoformat`` writes the same text from the year
    1000 on, in a third of ``strftime``'s time)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    if value.year < 1000:
        return value.strftime(DATE_FORMAT)
    return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(value: object) -> object:
    """The UTC datetime a ``DATE_FORMAT`` string stands for; anything else as it is."""
    if isinstance(value, str):
        try:
            if _FIXED_TIME.fullmatch(value):  # as written by format_time: no strptime
                return datetime.fromisoformat(value[:-1]).replace(tzinfo=UTC)
            return datetime.strptime(value, DATE_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            return value
    return value


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return format_time(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


#: Compact JSON as Cosmos stores it; one encoder for every call (``json.dumps`` with
#: options builds a new one each time).
_ENCODER = json.JSONEncoder(
    default=_json_default, allow_nan=False, separators=(",", ":"), ensure_ascii=False
)


def _encoded(value: object) -> str:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"not storable as JSON: {exc}") from exc


def _utf8_size(text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise InvalidPayload(f"not storable as JSON: {exc}") from exc


def to_json(value: object) -> object:
    """``value`` as the JSON-compatible data Cosmos stores (datetimes as strings)."""
    return json.loads(_encoded(value))


def _plain(value: object) -> bool:
    """Whether ``value`` is already JSON data that :func:`to_json` would return unchanged:
    str-keyed dicts, lists, strings, ints, bools, None and finite floats only."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())  # type: ignore[attr-defined]
    if kind is list:
        return all(_plain(v) for v in value)  # type: ignore[attr-defined]
    return kind is float and math.isfinite(value)  # type: ignore[arg-type]


def json_value(value: object) -> object:
    """``to_json(value)``, or ``value`` itself (not a copy) when it is JSON data already,
    as a store's state in stored form is: checked in one walk instead of an encoding and
    a decoding. For values that are only read (serialized) afterwards."""
    try:
        if _plain(value):
            return value
    except RecursionError:
        pass
    return to_json(value)


def json_size(value: object) -> int:
    """``item_size(to_json(value))`` in one encoding, or more: keys that collide once
    turned into strings (``1`` and ``"1"``) count twice, so it is an upper bound.
    InvalidPayload, as :func:`to_json`, for what JSON cannot hold."""
    return _utf8_size(_encoded(value))


class ItemCodec:
    """Maps documents to items for one container's partition-key layout.

    ``partition_key_path`` is ``/id`` (the default: one logical partition per aggregate)
    or a top-level field such as ``/pk``, whose value is ``partition_key(aggregate_id)``
    (default: the encoded ID).
    """

    def __init__(
        self,
        partition_key_path: str = "/id",
        partition_key: Callable[[AggregateId], str] | None = None,
    ) -> None:
        field = partition_key_path.removeprefix("/")
        if not field or "/" in field or field in SYSTEM_FIELDS - {"id"} or field == ID:
            raise ValueError(f"unsupported partition key path: {partition_key_path!r}")
        self.partition_key_path = partition_key_path
        self.field = field
        self._partition_key = partition_key

    def key(self, aggregate_id: object) -> tuple[str, str]:
        """(item id, partition-key value) of an aggregate; InvalidAggregateId if unusable."""
        item_id = encode_id(aggregate_id)
        if self.field == "id":
            return item_id, item_id
        if self._partition_key is None:
            return item_id, item_id
        assert isinstance(aggregate_id, str | int)
        return item_id, check_partition_value(self._partition_key(aggregate_id))

    def to_item(self, document: Document) -> Item:
        aggregate_id = document[ID]
        item_id, pk = self.key(aggregate_id)
        body = {k: v for k, v in document.items() if k != ID}
        item = to_json(body)
        assert isinstance(item, dict)
        item["id"] = item_id
        item["aid"] = aggregate_id
        if self.field != "id":
            item[self.field] = pk
        return item

    def to_document(self, item: Item) -> Document:
        doc: Document = {ID: item["aid"] if "aid" in item else decode_id(item["id"])}
        for key, value in item.items():
            if key in SYSTEM_FIELDS or (key == self.field and self.field != "id"):
                continue
            doc[key] = value
        for key in ("created_at", "updated_at", EARLIEST_DUE):
            if key in doc:
                doc[key] = parse_time(doc[key])
        outbox = doc.get("outbox")
        if isinstance(outbox, list):
            doc["outbox"] = [_entry_times(e) for e in outbox]
        return doc


def _entry_times(entry: object) -> object:
    """A stored entry with its times (``created_at``, and ``due`` if scheduled) parsed."""
    if not isinstance(entry, dict) or "created_at" not in entry:
        return entry
    parsed = {**entry, "created_at": parse_time(entry["created_at"])}
    if DUE in entry:
        parsed[DUE] = parse_time(entry[DUE])
    return parsed


def item_size(item: object) -> int:
    return len(json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode())


def literal(value: str) -> str:
    """A Cosmos SQL string literal: JSON-escaped ASCII, safe inside a predicate."""
    return json.dumps(value, ensure_ascii=True)


def commit_patch(plan: CommitPlan) -> tuple[PatchOps, str] | None:
    """The commit as one patch guarded by ``version``; None when it needs over 10 ops.

    Entries are appended one ``add /outbox/-`` each, so a concurrent trim (which removes
    by index, guarded by the IDs at those indexes) can neither lose nor remove them.
    """
    if plan.inbox_push and plan.inbox_after is None:
        return None
    ops: PatchOps = [
        {"op": "set", "path": "/state", "value": json_value(plan.state)},
        {"op": "incr", "path": "/version", "value": 1},
        {"op": "set", "path": "/outbox_seq", "value": plan.outbox_seq},
        {"op": "set", "path": "/updated_at", "value": format_time(plan.updated_at)},
    ]
    if plan.inbox_after is not None:
        ops.append({"op": "set", "path": "/inbox", "value": list(plan.inbox_after)})
    if plan.inbox_marks is not None:
        ops.append({"op": "set", "path": "/inbox_marks", "value": to_json(plan.inbox_marks)})
    if plan.inbox_spill is not None:
        ops.append({"op": "set", "path": "/inbox_spill", "value": to_json(plan.inbox_spill)})
    if plan.state_version is not None:
        ops.append({"op": "set", "path": "/state_version", "value": plan.state_version})
    ops.extend({"op": "add", "path": "/outbox/-", "value": to_json(e)} for e in plan.outbox_push)
    if len(ops) > MAX_PATCH_OPS:
        return None
    return ops, f"FROM c WHERE c.version = {int(plan.expected_version)}"


def trim_patches(outbox: list[Any], entry_ids: Collection[str]) -> list[tuple[PatchOps, str]]:
    """Patches removing the entries with those IDs, highest index first, 10 per patch.

    Each patch is guarded by the IDs found at the indexes it removes, so it applies only
    while those entries are still exactly there; removals never shift lower indexes and
    commits only append, so the patches stay valid one after another.
    """
    wanted = set(entry_ids)
    indexes = [
        i
        for i, entry in enumerate(outbox)
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"] in wanted
    ]
    indexes.reverse()
    patches = []
    for start in range(0, len(indexes), MAX_PATCH_OPS):
        chunk = indexes[start : start + MAX_PATCH_OPS]
        ops = [{"op": "remove", "path": f"/outbox/{i}"} for i in chunk]
        guard = " AND ".join(f"c.outbox[{i}].id = {literal(outbox[i]['id'])}" for i in chunk)
        patches.append((ops, f"FROM c WHERE {guard}"))
    return patches


def failure_patch(outbox: list[Any], plan: FailurePlan) -> tuple[PatchOps, str] | None:
    """Record a failed publish on the first entry with the plan's ID; None if absent."""
    for i, entry in enumerate(outbox):
        if isinstance(entry, dict) and entry.get("id") == plan.entry_id:
            ops: PatchOps = [
                {"op": "set", "path": f"/outbox/{i}/attempts", "value": plan.attempts},
                {"op": "set", "path": f"/outbox/{i}/last_error", "value": plan.last_error},
            ]
            return ops, f"FROM c WHERE c.outbox[{i}].id = {literal(plan.entry_id)}"
    return None


Query = tuple[str, list[dict[str, Any]]]


def due_queries(
    due_before: datetime,
    after: AggregateId | None,
    limit: int,
    partitions: Collection[int] | None,
) -> list[Query]:
    """Parameterized queries for documents whose ``earliest_due`` is at or before
    ``due_before``, after ``after`` (in :func:`pending_queries`' order). Times are
    stored as fixed-width UTC text, so they compare as text; the default indexing
    policy indexes the field."""
    common = ["IS_DEFINED(c.earliest_due)", "c.earliest_due <= @due"]
    params: list[dict[str, Any]] = [
        {"name": "@limit", "value": int(limit)},
        {"name": "@due", "value": format_time(due_before)},
    ]
    return _paged(common, params, after, partitions)


def pending_queries(
    after: AggregateId | None,
    limit: int,
    older_than: datetime | None,
    partitions: Collection[int] | None,
) -> list[Query]:
    """Parameterized queries for documents with pending entries after ``after``.

    Integer IDs come before strings (as in MongoDB's ``_id`` order): one query per type,
    run in turn until ``limit`` documents are found.
    """
    common = ["ARRAY_LENGTH(c.outbox) > 0"]
    params: list[dict[str, Any]] = [{"name": "@limit", "value": int(limit)}]
    if older_than is not None:
        # A scheduled entry counts from its due time (the due query finds it before).
        common.append(
            "EXISTS(SELECT VALUE e FROM e IN c.outbox WHERE e.created_at < @older"
            " AND (NOT IS_DEFINED(e.due) OR e.due < @older))"
        )
        params.append({"name": "@older", "value": format_time(older_than)})
    return _paged(common, params, after, partitions)


def _paged(
    common: list[str],
    params: list[dict[str, Any]],
    after: AggregateId | None,
    partitions: Collection[int] | None,
) -> list[Query]:
    """``common`` conditions, paged by ``aid`` after ``after``, in ``partitions``."""
    if partitions is not None:
        common.append("ARRAY_CONTAINS(@partitions, c.partition)")
        params.append({"name": "@partitions", "value": sorted(int(p) for p in partitions)})
    queries: list[Query] = []
    kinds = ["IS_STRING"] if isinstance(after, str) else ["IS_NUMBER", "IS_STRING"]
    for kind in kinds:
        where = [*common, f"{kind}(c.aid)"]
        qparams = list(params)
        if after is not None and (kind == "IS_STRING") == isinstance(after, str):
            where.append("c.aid > @after")
            qparams.append({"name": "@after", "value": after})
        sql = f"SELECT TOP @limit * FROM c WHERE {' AND '.join(where)} ORDER BY c.aid"
        queries.append((sql, qparams))
    return queries
