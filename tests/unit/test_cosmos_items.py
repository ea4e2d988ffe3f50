"""The Cosmos adapter's pure parts: ID encoding, item layout, patches, queries, errors."""

from __future__ import annotations

import contextlib
import random
import string
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.cosmos import exceptions as cosmos_errors

from docoutbox.dispatch.engine.flow import DispatchPolicy, Publish, dispatch_document
from docoutbox.errors import (
    DocumentTooLarge,
    InvalidAggregateId,
    InvalidPayload,
    PermanentStoreError,
    TransientStoreError,
)
from docoutbox.store.core import Write
from docoutbox.store.document import ID, REVISION, new_document
from docoutbox.store.plans import CommitPlan, FailurePlan, TrimPlan, apply_plan, plan_trim
from docoutbox_cosmos import operations as flows
from docoutbox_cosmos.backend import CosmosBackend
from docoutbox_cosmos.errors import (
    Refusal,
    Throttled,
    owner_missing,
    refusal,
    retry_after,
    translate,
)
from docoutbox_cosmos.items import (
    DATE_FORMAT,
    MAX_PATCH_OPS,
    ItemCodec,
    commit_patch,
    decode_id,
    encode_id,
    failure_patch,
    format_time,
    item_size,
    json_size,
    json_value,
    parse_time,
    pending_queries,
    to_json,
    trim_patches,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


@pytest.mark.parametrize(
    "aggregate_id", ["a", "a/b", "a\\b?c#d", "~", "~n5", "~~", "é€", 0, 7, -12, 2**62]
)
def test_ids_encode_reversibly_and_only_with_allowed_characters(aggregate_id: Any) -> None:
    encoded = encode_id(aggregate_id)
    assert not set(encoded) & set("/\\?#")
    assert decode_id(encoded) == aggregate_id


def test_random_ids_never_collide() -> None:
    rng = random.Random(3)
    alphabet = "ab~/\\?#n5"
    ids: set[Any] = {"".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(3000)}
    ids |= set(range(-50, 50)) | {str(i) for i in range(-50, 50)}
    encoded = {encode_id(i) for i in ids}
    assert len(encoded) == len(ids)
    assert all(decode_id(encode_id(i)) == i for i in ids)


@pytest.mark.parametrize("bad", ["", None, True, 1.5, {"$ne": None}, ["x"], "/" * 200, "x" * 256])
def test_unstorable_ids_are_refused_before_any_request(bad: Any) -> None:
    with pytest.raises(InvalidAggregateId):
        encode_id(bad)


def test_ids_encode_as_the_per_character_escape_rule_says() -> None:
    rng = random.Random(5)
    escapes = {"~": "~~", "/": "~s", "\\": "~b", "?": "~q", "#": "~h"}
    for _ in range(2000):
        text = "".join(rng.choices("ab~/\\?#é€\t", k=rng.randint(1, 40)))
        assert encode_id(text) == "".join(escapes.get(ch, ch) for ch in text)


def test_partition_key_values_are_checked() -> None:
    codec = ItemCodec("/tenant", lambda aggregate_id: f"t/{aggregate_id}")
    with pytest.raises(InvalidAggregateId):
        codec.key("a")
    assert ItemCodec("/tenant", lambda a: "t1").key("a/b") == ("a~sb", "t1")
    with pytest.raises(ValueError, match="partition key path"):
        ItemCodec("/_etag")


def test_documents_round_trip_through_items() -> None:
    codec = ItemCodec("/pk")
    doc = new_document(7, "Counter", {"n": 1}, 3, NOW)
    doc["outbox"] = [{"id": "e1", "seq": 1, "created_at": NOW, "payload": {"at": "2026"}}]
    item = codec.to_item(doc)
    assert (item["id"], item["aid"], item["pk"]) == ("~n7", 7, "~n7")
    assert item["created_at"] == "2026-01-02T03:04:05.678000Z"
    stored = {**item, "_etag": "x", "_ts": 1, "_rid": "r", "_self": "s"}
    assert codec.to_document(stored) == doc


def _commit(emits: int, **changes: Any) -> CommitPlan:
    fields: dict[str, Any] = {
        "aggregate_id": "a",
        "expected_version": 4,
        "state": {"n": 1},
        "outbox_push": tuple({"id": f"e{i}", "seq": i, "created_at": NOW} for i in range(emits)),
        "outbox_seq": emits,
        "inbox_push": ("m1",),
        "inbox_window": 100,
        "inbox_after": ("m0", "m1"),
        "inbox_marks": None,
        "updated_at": NOW,
    }
    return CommitPlan(**{**fields, **changes})


def test_commit_is_one_patch_guarded_by_version_up_to_ten_ops() -> None:
    patch = commit_patch(_commit(5))
    assert patch is not None
    ops, predicate = patch
    assert len(ops) == MAX_PATCH_OPS and predicate == "FROM c WHERE c.version = 4"
    assert {"op": "incr", "path": "/version", "value": 1} in ops
    assert [op["path"] for op in ops].count("/outbox/-") == 5
    assert commit_patch(_commit(6)) is None  # 11 ops: the replace path takes it
    assert commit_patch(_commit(1, inbox_after=None)) is None


def _doc_with(outbox: list[dict[str, Any]]) -> dict[str, Any]:
    doc = new_document("a", "Counter", {}, 0, NOW)
    doc["outbox"] = outbox
    return doc


def test_trim_patches_remove_highest_index_first_guarded_by_ids() -> None:
    outbox = [{"id": f"e{i}", "seq": i} for i in range(25)]
    wanted = [f"e{i}" for i in range(0, 25, 2)] + ['q"uote']
    patches = trim_patches([*outbox, {"id": 'q"uote'}], wanted)
    assert [len(ops) for ops, _ in patches] == [10, 4]
    first_ops, first_guard = patches[0]
    assert first_ops[0] == {"op": "remove", "path": "/outbox/25"}
    assert first_guard.startswith('FROM c WHERE c.outbox[25].id = "q\\"uote"')
    removed = [int(op["path"].rsplit("/", 1)[1]) for ops, _ in patches for op in ops]
    assert removed == sorted(removed, reverse=True)


def test_failure_patch_targets_the_entry_by_index_and_id() -> None:
    outbox = [{"id": "e0"}, {"id": "e1"}]
    patch = failure_patch(outbox, FailurePlan("a", "e1", 2, "boom"))
    assert patch is not None
    ops, guard = patch
    assert ops[0]["path"] == "/outbox/1/attempts" and guard == 'FROM c WHERE c.outbox[1].id = "e1"'
    assert failure_patch(outbox, FailurePlan("a", "zz", 1, "x")) is None


def test_pending_queries_are_parameterized() -> None:
    hostile = "x' OR 1=1 --"
    queries = pending_queries(hostile, 5, NOW, {3, 1})
    assert len(queries) == 1  # after a string, only strings follow
    sql, params = queries[0]
    assert hostile not in sql and "IS_STRING(c.aid)" in sql
    values = {p["name"]: p["value"] for p in params}
    assert values == {
        "@limit": 5,
        "@after": hostile,
        "@older": "2026-01-02T03:04:05.678000Z",
        "@partitions": [1, 3],
    }
    numbers, strings = pending_queries(4, 5, None, None)
    assert "IS_NUMBER" in numbers[0] and "@after" in numbers[0]
    assert "@after" not in strings[0]


class ScriptedContainer:
    """Answers each request from a script of results or exceptions, and records them."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls: list[str] = []

    def _next(self, name: str) -> Any:
        self.calls.append(name)
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def read_item(self, **kwargs: Any) -> Any:
        return self._next("read")

    def patch_item(self, **kwargs: Any) -> Any:
        return self._next("patch")

    def replace_item(self, **kwargs: Any) -> Any:
        return self._next("replace")


class FakeResponse:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers
        self.reason = "scripted"

    def text(self) -> str:
        return ""


def http_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    return cosmos_errors.CosmosHttpResponseError(
        status_code=status, message=f"status {status}", response=FakeResponse(status, headers or {})
    )


def _backend(script: list[Any]) -> tuple[CosmosBackend, list[float]]:
    backend = CosmosBackend(ScriptedContainer(script))
    slept: list[float] = []
    backend.sleep = slept.append
    return backend, slept


def test_throttled_requests_are_resent_after_the_servers_delay() -> None:
    backend, slept = _backend([http_error(429, {"x-ms-retry-after-ms": "250"}), {"version": 5}])
    assert backend.write(_commit(1))
    assert slept == [0.25]


def test_throttling_that_persists_is_a_transient_error() -> None:
    backend, slept = _backend([http_error(429, {"x-ms-retry-after-ms": "10"})] * 10)
    with pytest.raises(Throttled) as caught:
        backend.write(_commit(1))
    assert caught.value.retry_after == 0.01 and len(slept) == 5


def test_a_trim_losing_a_race_rereads_and_never_touches_version() -> None:
    codec = ItemCodec()
    doc = _doc_with([{"id": "e0"}, {"id": "e1"}])
    item = codec.to_item(doc)
    moved = codec.to_item(_doc_with([{"id": "e1"}]))  # another trim removed e0 meanwhile
    backend, _ = _backend([item, http_error(412), moved, {}])
    assert backend.write(TrimPlan("a", ("e1",)))
    container = backend.container
    assert isinstance(container, ScriptedContainer)
    assert container.calls == ["read", "patch", "read", "patch"]


def test_a_trim_after_a_load_is_one_request_and_unknown_ids_force_a_read() -> None:
    codec = ItemCodec()
    item = codec.to_item(_doc_with([{"id": "e0"}, {"id": "e1"}]))
    backend, _ = _backend([item, {}, item, {}])
    assert backend.load("a") is not None
    assert backend.write(TrimPlan("a", ("e0",)))
    container = backend.container
    assert isinstance(container, ScriptedContainer)
    assert container.calls == ["read", "patch"]  # the outbox was remembered from the load
    # e9 is not in the remembered outbox (it may be newer): read before concluding.
    assert backend.write(TrimPlan("a", ("e1", "e9")))
    assert container.calls == ["read", "patch", "read", "patch"]


def test_a_large_commit_retries_its_replace_when_only_the_etag_moved() -> None:
    codec = ItemCodec()
    doc = {**_doc_with([]), "version": 4}
    item = {**codec.to_item(doc), "_etag": "e1"}
    trimmed = {**item, "_etag": "e2"}
    backend, _ = _backend([item, http_error(412), trimmed, {}])
    assert backend.write(_commit(8))
    assert backend.container.calls == ["read", "replace", "read", "replace"]  # type: ignore[attr-defined]
    stale = {**item, "version": 5}
    backend, _ = _backend([stale])
    assert not backend.write(_commit(8))


def test_replace_fallback_applies_the_reference_semantics() -> None:
    codec = ItemCodec()
    doc = {**_doc_with([{"id": "old", "seq": 0, "created_at": NOW}]), "version": 4}
    item = {**codec.to_item(doc), "_etag": "e1"}
    flow = flows.write(codec, _commit(8))
    read = next(flow)
    assert isinstance(read, flows.Read)
    replace = flow.send(item)
    assert isinstance(replace, flows.Replace) and replace.etag == "e1"
    expected = apply_plan(doc, _commit(8))
    assert codec.to_document(replace.item) == expected
    assert expected is not None and expected[ID] == "a"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, PermanentStoreError),
        (401, PermanentStoreError),
        (403, PermanentStoreError),
        (408, TransientStoreError),
        (413, DocumentTooLarge),
        (429, Throttled),
        (449, TransientStoreError),
        (500, TransientStoreError),
        (503, TransientStoreError),
    ],
)
def test_errors_are_translated_by_status(status: int, kind: type[Exception]) -> None:
    assert isinstance(translate(http_error(status), "a"), kind)


def test_expected_refusals_and_timeouts() -> None:
    assert refusal(http_error(404)) is Refusal.MISSING
    assert refusal(http_error(409)) is Refusal.EXISTS
    assert refusal(http_error(412)) is Refusal.STALE
    assert refusal(http_error(500)) is None
    assert isinstance(translate(ServiceRequestError("refused")), TransientStoreError)
    assert isinstance(translate(cosmos_errors.CosmosClientTimeoutError()), TransientStoreError)
    assert retry_after(http_error(449), 0) is not None
    assert retry_after(http_error(503), 0) is None


def test_dates_compare_in_time_order_as_stored_strings() -> None:
    codec = ItemCodec()
    stamps = [NOW + timedelta(microseconds=n * 997) for n in range(50)]
    rendered = [codec.to_item({**_doc_with([]), "updated_at": t})["updated_at"] for t in stamps]
    assert rendered == sorted(rendered)
    assert all(len(r) == len(rendered[0]) for r in rendered)
    assert set(string.digits) >= set(rendered[0][:4])


def _strptime_reading(value: object) -> object:
    """What parse_time did before its fast path: strptime, or the value unchanged."""
    if not isinstance(value, str):
        return value
    try:
        return datetime.strptime(value, DATE_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return value


def test_times_render_and_parse_as_strftime_and_strptime_do() -> None:
    rng = random.Random(11)
    stamps = [datetime(1000, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999)]
    stamps += [datetime(999, 5, 6, 7, 8, 9, 10, tzinfo=UTC), NOW.replace(microsecond=0)]
    stamps.append(datetime(2026, 3, 4, 5, 6, 7, 8, tzinfo=timezone(timedelta(hours=-5))))
    for _ in range(500):
        stamps.append(
            datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.getrandbits(56))
        )
    for stamp in stamps:
        aware = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        rendered = format_time(stamp)
        assert rendered == aware.astimezone(UTC).strftime(DATE_FORMAT)
        assert parse_time(rendered) == _strptime_reading(rendered)
    odd = [
        "2026-01-02T03:04:05.678Z",  # fewer digits: strptime's reading
        "2026-1-2T3:4:5.678000Z",
        "2026-13-02T03:04:05.678000Z",  # no such month
        "2026-02-30T03:04:05.678000Z",
        "2026-01-02T24:00:00.000000Z",
        "2026-01-02T03:04:60.000000Z",
        "2026-01-02T03:04:05.678+01Z",
        "2026-01-02 03:04:05.678000Z",
        "٢٠٢٦-01-02T03:04:05.678000Z",  # non-ASCII digits
        "2026-01-02T03:04:05.678000",
        "2026-01-02T03:04:05.678000Z ",
        "hello",
        "",
        7,
        None,
    ]
    for value in odd:
        assert parse_time(value) == _strptime_reading(value), value


def test_json_size_is_the_size_of_the_stored_json_in_one_encoding() -> None:
    doc = _doc_with([{"id": "e1", "created_at": NOW, "payload": {"t": "é€😀", "f": 1.5}}])
    doc["state"] = {"n": 1, "nested": [1, (2, 3), {"k": None}], "text": 'a"b\\c\u0001'}
    assert json_size(doc) == item_size(to_json(doc))
    assert json_size({1: "a", "1": "b"}) >= item_size(to_json({1: "a", "1": "b"}))
    for bad in ({"x": float("nan")}, {"x": {1, 2}}, {"x": object()}, {"x": "\ud800"}):
        with pytest.raises(InvalidPayload):
            json_size(bad)
    with pytest.raises(InvalidPayload):
        to_json({"x": float("inf")})
    assert to_json({"t": "\ud800é"}) == {"t": "\ud800é"}


def test_json_value_is_to_json_and_skips_the_copy_only_for_json_data() -> None:
    plain = {"n": 1, "f": -0.0, "t": "é\ud800", "l": [True, None, {"k": [1.5, "x"]}], "e": {}}
    assert json_value(plain) is plain
    assert json_value(plain) == to_json(plain)
    for converted in ({"t": (1, 2)}, {1: "a"}, {"at": NOW}, [{"x": {"y": (3,)}}]):
        assert json_value(converted) == to_json(converted)
        assert json_value(converted) is not converted
    for bad in ({"x": float("nan")}, {"x": [float("-inf")]}, {"x": {1, 2}}, {"x": b"b"}):
        with pytest.raises(InvalidPayload):
            json_value(bad)
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(RecursionError):  # as to_json, which gets it from json
        json_value(deep)


class RecordingContainer(ScriptedContainer):
    """A scripted container that also records each patch's operations and predicate."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__(script)
        self.patches: list[tuple[list[dict[str, Any]], str]] = []

    def patch_item(self, **kwargs: Any) -> Any:
        self.patches.append((kwargs["patch_operations"], kwargs.get("filter_predicate")))
        self.etags.append(kwargs.get("etag"))
        return self._next("patch")

    @property
    def etags(self) -> list[str | None]:
        return self.__dict__.setdefault("_etags", [])


def test_a_trim_with_an_outbox_hint_is_one_patch_aimed_at_those_positions() -> None:
    container = RecordingContainer([{}])
    backend = CosmosBackend(container)
    assert backend.write(plan_trim("a", ["e1", "e2"], ["e0", "e1", "e2", None]))
    assert container.calls == ["patch"]  # no read: the dispatcher's copy gave the positions
    ops, predicate = container.patches[0]
    assert ops == [{"op": "remove", "path": "/outbox/2"}, {"op": "remove", "path": "/outbox/1"}]
    assert predicate == 'FROM c WHERE c.outbox[2].id = "e2" AND c.outbox[1].id = "e1"'


def test_a_stale_outbox_hint_costs_a_read_never_a_wrong_removal() -> None:
    codec = ItemCodec()
    moved = codec.to_item(_doc_with([{"id": "e1"}, {"id": "e5"}]))  # e0 went meanwhile
    container = RecordingContainer([http_error(412), moved, {}])
    backend = CosmosBackend(container)
    assert backend.write(plan_trim("a", ["e1"], ["e0", "e1"]))
    assert container.calls == ["patch", "read", "patch"]
    assert [p[1] for p in container.patches] == [
        'FROM c WHERE c.outbox[1].id = "e1"',
        'FROM c WHERE c.outbox[0].id = "e1"',
    ]
    # A hint without some of the IDs (they may be newer than the copy) reads first.
    container = RecordingContainer([moved, {}])
    assert CosmosBackend(container).write(plan_trim("a", ["e1", "e5"], ["e1"]))
    assert container.calls == ["read", "patch"]


def test_the_dispatch_flow_hints_the_outbox_left_after_each_partial_trim() -> None:
    entry = {
        "type": "T",
        "payload": {},
        "headers": {},
        "created_at": NOW,
        "aggregate_id": "a",
        "aggregate_type": "Counter",
    }
    doc = _doc_with([{**entry, "id": f"e{i}", "seq": i} for i in range(1, 6)])
    doc["outbox"].insert(2, {"seq": 0})  # malformed: quarantined, keeps its position
    flow = dispatch_document(doc, DispatchPolicy(trim_every=2), random.Random(0))
    trims: list[Any] = []
    answer: Any = None
    with contextlib.suppress(StopIteration):
        while True:
            op = flow.send(answer)
            answer = True if isinstance(op, Write) else None
            if isinstance(op, Write):
                trims.append(op.plan)
            assert isinstance(op, Publish | Write) or type(op).__name__ == "Quarantine"
    assert [t.entry_ids for t in trims] == [("e1", "e2"), ("e3", "e4"), ("e5",)]
    assert [t.outbox for t in trims] == [
        ("e1", "e2", None, "e3", "e4", "e5"),
        (None, "e3", "e4", "e5"),
        (None, "e5"),
    ]  # the entry without an ID is never named, so it stays (and keeps its position)


def test_a_trim_from_a_copy_with_an_etag_is_one_if_match_patch() -> None:
    container = RecordingContainer([{"_etag": "t2"}])
    assert CosmosBackend(container).write(plan_trim("a", ["e1"], ["e0", "e1"], "t1"))
    assert container.calls == ["patch"]
    assert container.patches == [([{"op": "remove", "path": "/outbox/1"}], None)]
    assert container.etags == ["t1"]


def test_an_item_changed_since_the_copy_is_trimmed_by_the_ids_at_its_positions() -> None:
    """A commit appended meanwhile (412 on the ETag): the IDs still at those positions guard
    the next patch, so the appended entry is neither lost nor removed."""
    container = RecordingContainer([http_error(412), {}])
    assert CosmosBackend(container).write(plan_trim("a", ["e0"], ["e0", "e1"], "t1"))
    assert container.calls == ["patch", "patch"]
    assert container.etags == ["t1", None]
    assert container.patches[1][1] == 'FROM c WHERE c.outbox[0].id = "e0"'


def test_over_ten_entries_chain_each_patch_on_the_etag_the_last_one_returned() -> None:
    ids = [f"e{i}" for i in range(12)]
    container = RecordingContainer([{"_etag": "t2"}, {"_etag": "t3"}])
    assert CosmosBackend(container).write(plan_trim("a", ids, ids, "t1"))
    assert container.etags == ["t1", "t2"]
    assert [len(ops) for ops, _ in container.patches] == [10, 2]
    # Without an ETag in the first answer, the rest is guarded by the IDs.
    container = RecordingContainer([{}, {}])
    assert CosmosBackend(container).write(plan_trim("a", ids, ids, "t1"))
    assert container.etags == ["t1", None]


def test_the_change_feed_copy_carries_its_etag_and_the_flow_hints_it_once() -> None:
    entry = {
        "type": "T",
        "payload": {},
        "headers": {},
        "created_at": NOW,
        "aggregate_id": "a",
        "aggregate_type": "Counter",
    }
    doc = _doc_with([{**entry, "id": f"e{i}", "seq": i} for i in range(1, 4)])
    doc[REVISION] = "t1"
    flow = dispatch_document(doc, DispatchPolicy(trim_every=2), random.Random(0))
    revisions: list[Any] = []
    answer: Any = None
    with contextlib.suppress(StopIteration):
        while True:
            op = flow.send(answer)
            answer = True if isinstance(op, Write) else None
            if isinstance(op, Write):
                revisions.append(op.plan.revision)
    assert revisions == ["t1", None]  # the first trim changes the ETag


def test_a_404_is_the_containers_by_sub_status_or_by_the_resource_it_targeted() -> None:
    owner = http_error(404, {"x-ms-substatus": "1003"})
    assert owner_missing(owner, container_request=False) is True
    assert owner_missing(http_error(404), container_request=True) is True  # create, query
    assert owner_missing(http_error(404), container_request=False) is None  # check it
    assert owner_missing(http_error(412), container_request=True) is False
