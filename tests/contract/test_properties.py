"""Property-based tests of the public API on memory, mongomock and the wire server.

For every call, with generated arguments good and bad: either the value round-trips
exactly (what was written is what is read back), or a :class:`DocOutboxError` is raised
and the collection (every document: version, state, inbox, outbox) is unchanged.

Examples per test: ``DOCOUTBOX_HYPOTHESIS_EXAMPLES`` (default 25; CI uses the default).
A failure prints the falsifying example and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import math
import os
import random
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import Field

from docoutbox import (
    Aggregate,
    AggregateStore,
    Decision,
    DocOutboxError,
    InboxPolicy,
    Message,
    RetryPolicy,
    StoreConfig,
    emit,
)
from docoutbox.model import storable_problem
from docoutbox.store.plans import entry_id
from docoutbox.testing import MemoryBackend
from tests.support.rawdocs import raw_documents

EXAMPLES = int(os.environ.get("DOCOUTBOX_HYPOTHESIS_EXAMPLES", "25"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
KINDS = ["memory", "mongomock", "wire-sync"]


class Rich(Aggregate):
    n: int = 0
    text: str = ""
    data: bytes = b""
    tags: list[str] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    when: datetime | None = None


class Other(Rich):
    more: int = 0


# -- strategies: mostly valid values, with the hostile ones mixed in ---------------------


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` most of the time, ``bad`` about one draw in twenty."""
    return st.integers(0, 19).flatmap(lambda i: bad if i == 0 else good)


SURROGATE = st.sampled_from(["\ud800", "a\udfffb", "\udc80"])
text = mostly(st.text(max_size=12), SURROGATE)
key = mostly(st.text(max_size=8) | st.sampled_from(["$op", "a.b", "_id"]), SURROGATE)
number = st.one_of(
    mostly(st.integers(-(2**63), 2**63 - 1), st.integers(min_value=2**63, max_value=2**70)),
    mostly(st.floats(allow_nan=False, allow_infinity=False), st.floats()),
)
scalar = st.one_of(st.none(), st.booleans(), number, text)
json_like = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(key, inner, max_size=3)),
    max_leaves=8,
)
payload = st.dictionaries(key, json_like, max_size=4)
aggregate_ids = mostly(
    st.text(min_size=1, max_size=20) | st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([-(2**63), 2**63 - 1, 2**63, -(2**63) - 1, "", None, True, 1.5])
    | st.sampled_from([{"$ne": None}, "\x00", "x" * 256])
    | SURROGATE,
)
message_ids = mostly(st.text(min_size=1, max_size=16), SURROGATE | st.just(""))
datetimes = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))


@st.composite
def states(draw: st.DrawFn) -> Any:
    """A Rich state: valid, or one of the ways a handler can hand over garbage."""
    fields = {
        "n": draw(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
        "text": draw(text),
        "data": draw(mostly(st.text(max_size=4).map(str.encode), st.binary(max_size=8))),
        "tags": draw(st.lists(text, max_size=3)),
        "extra": draw(payload),
        "when": draw(st.none() | datetimes),
    }
    how = draw(mostly(st.just("valid"), st.sampled_from(["copy", "construct", "subclass"])))
    if how == "copy":
        return Rich(**fields).model_copy(update={"n": draw(st.sampled_from(["x", 1.5, None]))})
    if how == "construct":
        return Rich.model_construct(**{**fields, "tags": draw(st.sampled_from([5, "s", None]))})
    if how == "subclass":
        return Other(**fields, more=1)
    return Rich(**fields)


def emits() -> st.SearchStrategy[list[Any]]:
    """Arguments for emit(): type, payload, headers, destination, id."""
    one = st.tuples(
        mostly(st.text(min_size=1, max_size=8), SURROGATE | st.just("")),
        payload,
        mostly(
            st.dictionaries(st.text(max_size=4), text, max_size=2),
            st.sampled_from([[], 0, "", {"h": 1}]),
        ),
        st.none() | text,
        st.none() | st.text(min_size=1, max_size=8),
    )
    return st.lists(one, max_size=3)


# -- the properties ---------------------------------------------------------------------


@pytest.fixture
def world(make_store: Any) -> Any:
    """A store over a fresh collection holding two bystander aggregates."""
    store = make_store(Rich)
    store.create("bystander", Rich(n=1, tags=["t"]))
    handler = lambda s, m: Decision(s, emit("E", {"k": 1}))  # noqa: E731
    store.handle("bystander", Message(id="b1", type="T"), handler)
    store.create(7, Rich(n=7))
    return store


on_stores = pytest.mark.parametrize("make_store", KINDS, indirect=True)


def unchanged(store: Any, before: dict[Any, Any], call: Any) -> None:
    """``call()`` must raise a DocOutboxError and leave every document as it was."""
    with pytest.raises(DocOutboxError):
        call()
    assert raw_documents(store) == before


def fresh_id() -> str:
    """A new aggregate per example (hypothesis replays examples on the same collection)."""
    return f"agg-{uuid.uuid4().hex}"


@on_stores
@PROPERTY
@given(aggregate_id=aggregate_ids, state=states())
def test_create_round_trips_or_writes_nothing(world: Any, aggregate_id: Any, state: Any) -> None:
    before = raw_documents(world)
    try:
        created = world.create(aggregate_id, state)
    except DocOutboxError as exc:
        event(f"refused: {type(exc).__name__}")
        assert raw_documents(world) == before
        return
    if aggregate_id in before:
        event("existed")
        assert not created.created
        assert raw_documents(world) == before
        return
    event("written")
    assert created.created
    assert world.get(aggregate_id).state == state
    after = raw_documents(world)
    assert {k: v for k, v in after.items() if k != aggregate_id} == before


@on_stores
@PROPERTY
@given(
    state=states(),
    emitted=emits(),
    message_id=message_ids,
    message_payload=payload,
)
def test_handle_round_trips_or_writes_nothing(
    world: Any,
    state: Any,
    emitted: list[Any],
    message_id: Any,
    message_payload: Any,
) -> None:
    aggregate_id = fresh_id()
    world.create(aggregate_id, Rich(n=1))
    before = raw_documents(world)
    old = world.get(aggregate_id)
    built: list[Any] = []

    def handler(current: Rich, message: Message) -> Any:
        for type_, body, headers, destination, id_ in emitted:
            built.append(emit(type_, body, headers=headers, destination=destination, id=id_))
        return Decision(state, built)

    message = {"id": message_id, "type": "T", "payload": message_payload}
    try:
        outcome = world.handle(aggregate_id, message, handler)
    except DocOutboxError as exc:
        event(f"refused: {type(exc).__name__}")
        assert raw_documents(world) == before
        return
    event("written")
    assert outcome.applied
    snap = world.get(aggregate_id)
    assert snap.version == old.version + 1
    assert snap.state == state
    assert snap.inbox[-1] == message_id
    assert [(e.type, e.payload, e.headers, e.destination) for e in snap.outbox] == [
        (e.type, e.payload, e.headers, e.destination) for e in built
    ]
    assert [e.seq for e in snap.outbox] == list(range(1, len(built) + 1))
    after = raw_documents(world)
    assert {k: v for k, v in after.items() if k != aggregate_id} == {
        k: v for k, v in before.items() if k != aggregate_id
    }


entry_ids = mostly(
    st.text(min_size=1, max_size=10),
    SURROGATE | st.sampled_from(["", None, 5, {"$exists": True}, {"$ne": None}, ["x"]]),
)


@on_stores
@PROPERTY
@given(
    ids=mostly(st.lists(st.one_of(entry_ids, st.just("REAL")), max_size=4), text),
)
def test_trim_removes_exactly_the_named_entries_or_writes_nothing(world: Any, ids: Any) -> None:
    aggregate_id = fresh_id()
    world.create(aggregate_id, Rich())
    handler = lambda s, m: Decision(s, [emit("E"), emit("F")])  # noqa: E731
    world.handle(aggregate_id, Message(id="m", type="T"), handler)
    real = [e.id for e in world.get(aggregate_id).outbox]
    if isinstance(ids, list):
        ids = [real[0] if item == "REAL" else item for item in ids]
    before = raw_documents(world)
    try:
        assert world.trim(aggregate_id, ids)
    except DocOutboxError as exc:
        event(f"refused: {type(exc).__name__}")
        assert raw_documents(world) == before
        return
    event("written")
    snap = world.get(aggregate_id)
    assert [e.id for e in snap.outbox] == [i for i in real if i not in set(ids)]
    assert snap.version == 1


@on_stores
@PROPERTY
@given(
    which=mostly(st.just("REAL"), entry_ids),
    attempts=mostly(
        st.integers(min_value=0, max_value=2**31 - 1),
        st.integers(min_value=-5, max_value=2**65) | st.sampled_from([True, 1.5, "3", None]),
    ),
    error=mostly(text, st.sampled_from([None, 5, b"x"])),
)
def test_record_failure_stores_exactly_or_writes_nothing(
    world: Any, which: Any, attempts: Any, error: Any
) -> None:
    aggregate_id = fresh_id()
    world.create(aggregate_id, Rich())
    world.handle(aggregate_id, Message(id="m", type="T"), lambda s, m: Decision(s, emit("E")))
    real = world.get(aggregate_id).outbox[0].id
    target = real if which == "REAL" else which
    before = raw_documents(world)
    try:
        recorded = world.record_failure(aggregate_id, target, attempts, error)
    except DocOutboxError as exc:
        event(f"refused: {type(exc).__name__}")
        assert raw_documents(world) == before
        return
    event("written")
    entry = world.get(aggregate_id).outbox[0]
    if target == real:
        assert recorded
        assert (entry.attempts, entry.last_error) == (attempts, error)
    else:
        assert not recorded
        assert raw_documents(world) == before
    assert world.get(aggregate_id).version == 1


@on_stores
@PROPERTY
@given(
    batch_size=st.one_of(
        st.integers(min_value=-3, max_value=300), st.sampled_from([True, 2.0, "5", None])
    )
)
def test_pending_pages_or_refuses(world: Any, batch_size: Any) -> None:
    before = raw_documents(world)
    try:
        found = [s.aggregate_id for s in world.pending(batch_size=batch_size)]
    except DocOutboxError as exc:
        event(f"refused: {type(exc).__name__}")
        assert raw_documents(world) == before
        return
    event("written")
    expected = sorted(
        (k for k, d in before.items() if d.get("outbox")),
        key=lambda k: (isinstance(k, str), k),
    )
    assert found == expected


# -- values built without a store: emit, Decision and the configs -------------------------


@settings(max_examples=EXAMPLES * 4, deadline=None, database=None)
@given(emitted=emits())
def test_emit_keeps_values_exactly_or_refuses(emitted: list[Any]) -> None:
    for type_, body, headers, destination, id_ in emitted:
        try:
            made = emit(type_, body, headers=headers, destination=destination, id=id_)
        except DocOutboxError:
            continue
        assert (made.type, made.payload, made.headers, made.destination, made.id) == (
            type_,
            body,
            headers,
            destination,
            id_,
        )
        assert storable_problem(made.payload) is None
        assert storable_problem(made.headers) is None


@settings(max_examples=EXAMPLES * 4, deadline=None, database=None)
@given(items=st.lists(st.one_of(st.just("emit"), scalar, st.lists(st.just("emit")))))
def test_decision_keeps_emits_or_refuses(items: list[Any]) -> None:
    args = [
        emit("E")
        if item == "emit"
        else [emit("E") for _ in item]
        if isinstance(item, list)
        else item
        for item in items
    ]
    try:
        decision = Decision(Rich(), *args)
    except DocOutboxError:
        return
    assert len(decision.emits) == sum(len(a) if isinstance(a, list) else 1 for a in args)


config_value = st.one_of(
    st.integers(min_value=-3, max_value=2**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@settings(max_examples=EXAMPLES * 4, deadline=None, database=None)
@given(
    field=st.sampled_from(["partitions", "cache_size", "deterministic_ids", "inbox", "retry"]),
    value=config_value,
    window=config_value,
    exact=config_value,
    max_above=config_value,
    attempts=config_value,
    base=config_value,
    cap=config_value,
)
def test_configs_hold_what_was_given_or_refuse(
    field: str,
    value: Any,
    window: Any,
    exact: Any,
    max_above: Any,
    attempts: Any,
    base: Any,
    cap: Any,
) -> None:
    for make, kwargs in (
        (InboxPolicy, {"window": window, "exact": exact, "max_above": max_above}),
        (RetryPolicy, {"max_attempts": attempts, "base_delay": base, "max_delay": cap}),
        (StoreConfig, {field: value}),
    ):
        try:
            config = make(**kwargs)
        except DocOutboxError:
            continue
        for name, given_value in kwargs.items():
            held = getattr(config, name)
            assert held == given_value and type(held) is type(given_value)
        if isinstance(config, RetryPolicy):
            delay = config.delay(3, random.Random(1))
            assert math.isfinite(delay) and 0 <= delay <= config.max_delay
        if isinstance(config, StoreConfig):
            store = AggregateStore(MemoryBackend(), Rich, config)
            handler = lambda s, m: Decision(s, emit("E"))  # noqa: E731
            outcome = store.handle(5, Message(id="m", type="T"), handler, create=True)
            assert outcome.applied
            assert 0 <= store.get(5).partition < config.partitions


def test_deterministic_entry_ids_are_stable() -> None:
    assert entry_id("Rich", 1, 1) == entry_id("Rich", 1, 1) != entry_id("Rich", 1, 2)
