"""Bad input at every public entry point: a typed error, and nothing written.

Each test names the defect it guards. They run over every store of the matrix in
tests/conftest.py (memory, mongomock, the wire server; sync and async).
"""

from __future__ import annotations

import math
import random
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel, Field

from docoutbox import (
    Aggregate,
    Decision,
    DocOutboxError,
    InboxPolicy,
    InvalidInput,
    Message,
    RetryPolicy,
    Status,
    StoreConfig,
    emit,
)
from docoutbox.errors import (
    DocumentTooLarge,
    InvalidAggregateId,
    InvalidConfig,
    InvalidHandlerResult,
    InvalidMessage,
    InvalidPayload,
)
from docoutbox.model import MAX_NESTING
from docoutbox.store.core import Outcome

MakeStore = Any


class Tally(Aggregate):
    n: int = 0
    notes: dict[str, Any] = Field(default_factory=dict)
    blob: bytes = b""


class Sub(Tally):
    extra: int = 1


class Bounded(Aggregate):
    n: int = Field(default=0, ge=0)


def view(store: Any, *ids: Any) -> list[Any]:
    """What the API shows of each aggregate: version, state, inbox, marks, outbox."""
    out = []
    for aggregate_id in ids:
        snap = store.load(aggregate_id)
        out.append(
            None
            if snap is None
            else (snap.version, snap.state, snap.inbox, snap.marks, snap.raw_outbox)
        )
    return out


@pytest.fixture
def store(make_store: MakeStore) -> Any:
    store = make_store(Tally)
    store.create("a", Tally(n=1))
    store.handle("a", Message(id="m0", type="T"), lambda s, m: Decision(s, emit("E")))
    store.create("b", Tally(n=2))
    return store


def returning(state: Any, *emits: Any) -> Any:
    def handler(current: Any, message: Message) -> Any:
        return Decision(state, *emits) if emits else state

    return handler


def nested(levels: int) -> Any:
    """A value of ``levels`` levels of dicts and lists (the value itself is the first)."""
    value: Any = 1
    for level in range(levels):
        value = {"k": value} if level % 2 else [value]
    return value


BAD_STATES = [
    pytest.param(lambda: Tally(n=1).model_copy(update={"n": "x"}), id="model_copy-wrong-type"),
    pytest.param(lambda: Tally.model_construct(n="zz"), id="model_construct-garbage"),
    pytest.param(lambda: Sub(n=1), id="subclass-extra-field"),
    pytest.param(lambda: Tally(notes={"\ud800": 1}), id="surrogate-key"),
    pytest.param(lambda: Tally(notes={"k": "\udfff"}), id="surrogate-value"),
    pytest.param(lambda: Tally(blob=b"\xff\xfe"), id="bytes-not-utf8"),
    pytest.param(lambda: Tally(notes={"x": math.nan}), id="nan-in-any"),
    pytest.param(lambda: Tally(notes={"x": [math.inf]}), id="inf-in-any"),
    # Stored as the text '1j' (pydantic's JSON mode), read back as a string.
    pytest.param(lambda: Tally(notes={"x": 1j}), id="complex-in-any"),
    pytest.param(lambda: Tally(notes={"x": [2 + 3j]}), id="complex-in-a-list"),
    # MongoDB refuses documents nested over 100 levels when they are written.
    pytest.param(lambda: Tally(notes={"x": nested(MAX_NESTING)}), id="nested-too-deep"),
]


@pytest.mark.parametrize("make_state", BAD_STATES)
def test_handler_state_that_would_not_read_back_is_refused(store: Any, make_state: Any) -> None:
    """Item 1 and 4-5: the state is checked before the commit; the aggregate stays readable."""
    before = view(store, "a", "b")
    with pytest.raises(InvalidInput):
        store.handle("a", Message(id="m1", type="T"), returning(make_state(), emit("E")))
    assert view(store, "a", "b") == before
    assert store.handle("a", Message(id="m1", type="T"), returning(Tally(n=5))).applied


@pytest.mark.parametrize("make_state", BAD_STATES)
def test_create_checks_the_state_before_inserting(store: Any, make_state: Any) -> None:
    with pytest.raises(InvalidInput):
        store.create("c", make_state())
    assert view(store, "a", "b", "c")[2] is None


def test_state_failing_its_own_validators_is_refused(make_store: MakeStore) -> None:
    store = make_store(Bounded)
    store.create("a", Bounded())
    with pytest.raises(InvalidHandlerResult):
        store.handle(
            "a", Message(id="m", type="T"), returning(Bounded().model_copy(update={"n": -1}))
        )
    assert store.get("a").version == 0


def test_handle_create_without_defaults_is_typed(make_store: MakeStore) -> None:
    class Needs(Aggregate):
        owner: str

    store = make_store(Needs)
    with pytest.raises(InvalidPayload):
        store.handle("x", Message(id="m", type="T"), returning(Needs(owner="o")), create=True)
    assert store.load("x") is None


@pytest.mark.parametrize(
    ("entry_id", "attempts", "error"),
    [
        ({"$exists": True}, 1, "e"),
        (None, 1, "e"),
        ("", 1, "e"),
        ("\ud800", 1, "e"),
        ("ok", "x", "e"),
        ("ok", 2**64, "e"),
        ("ok", -1, "e"),
        ("ok", True, "e"),
        ("ok", 1, 5),
        ("ok", 1, None),
        ("ok", 1, "\ud800"),
    ],
)
def test_record_failure_checks_its_arguments(
    store: Any, entry_id: Any, attempts: Any, error: Any
) -> None:
    """Item 2: an operator document never reaches the filter; the outbox stays readable."""
    before = view(store, "a", "b")
    with pytest.raises(InvalidMessage):
        store.record_failure("a", entry_id, attempts, error)
    assert view(store, "a", "b") == before
    assert store.get("a").outbox[0].attempts == 0


@pytest.mark.parametrize("ids", [[{"$ne": None}], [None], [5], ["\ud800"], "abc", None, [""]])
def test_trim_checks_entry_ids(store: Any, ids: Any) -> None:
    """Item 3."""
    before = view(store, "a", "b")
    with pytest.raises(InvalidMessage):
        store.trim("a", ids)
    assert view(store, "a", "b") == before


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": -1},
        {"batch_size": 1.5},
        {"batch_size": True},
        {"older_than": "yesterday"},
        {"older_than": datetime(2020, 1, 1)},
        {"partitions": [-1]},
        {"partitions": ["0"]},
        {"partitions": 3},
    ],
)
def test_pending_checks_its_arguments_before_querying(store: Any, kwargs: Any) -> None:
    """Item 3: ``pending(batch_size=0)`` raised a raw IndexError."""
    with pytest.raises(InvalidInput):
        store.pending(**kwargs)


@pytest.mark.parametrize(
    "aggregate_id", ["\ud800", "a\udfffb", 2**63, -(2**63) - 1, 1.0, b"a", None]
)
def test_bad_aggregate_ids_are_typed(store: Any, aggregate_id: Any) -> None:
    """Item 4: a lone surrogate raised UnicodeEncodeError."""
    with pytest.raises(InvalidAggregateId):
        store.create(aggregate_id, Tally())
    with pytest.raises(InvalidAggregateId):
        store.handle(aggregate_id, Message(id="m", type="T"), returning(Tally()), create=True)


@pytest.mark.parametrize("aggregate_id", [-(2**63), 2**63 - 1, 0])
def test_the_whole_int64_range_is_accepted(store: Any, aggregate_id: int) -> None:
    """Item 6: ``-2**63`` was refused."""
    assert store.create(aggregate_id, Tally(n=3)).created
    assert store.get(aggregate_id).state.n == 3


@pytest.mark.parametrize(
    "message",
    [
        {"id": "\ud800", "type": "T"},
        {"id": "m", "type": "T", "payload": {"k": "\ud800"}},
        {"id": "m", "type": "T", "payload": {"\ud800": 1}},
        {"id": "m", "type": "T", "headers": {"h": "\ud800"}},
        {"id": "m", "type": "T", "payload": {"k": math.nan}},
        {"id": "m", "type": "T", "payload": {"k": 1j}},
        {"id": "m", "type": "T", "correlation_id": "\ud800"},
        {"id": "m", "type": "T", "payload": {"k": nested(MAX_NESTING)}},
        {"id": "m", "type": "T", "headers": nested(MAX_NESTING + 1)},
    ],
)
def test_messages_with_unstorable_text_are_typed(store: Any, message: Any) -> None:
    """Item 4: these raised UnicodeEncodeError from the driver (or were stored renamed)."""
    before = view(store, "a", "b")
    with pytest.raises(InvalidInput):
        store.handle("a", message, returning(Tally(n=9)))
    assert view(store, "a", "b") == before


@pytest.mark.parametrize(
    "make_emit",
    [
        lambda: emit("E", {"k": "\ud800"}),
        lambda: emit("E", headers={"h": "\udc00"}),
        lambda: emit("E", {"k": [math.inf]}),
        lambda: emit("\ud800"),
        lambda: emit("E", destination="\ud800"),
        lambda: emit("E", {"k": nested(MAX_NESTING)}),
    ],
)
def test_unstorable_emits_are_typed(make_emit: Any) -> None:
    with pytest.raises(InvalidInput):
        make_emit()


@pytest.mark.parametrize("headers", [[], 0, "", [("a", "b")], {"a": 1}])
def test_emit_headers_must_be_a_mapping_of_text(headers: Any) -> None:
    """Item 6: ``emit("E", headers=[])`` was silently ``{}``."""
    with pytest.raises(InvalidInput):
        emit("E", headers=headers)


@pytest.mark.parametrize("bad", [5, "E", None, {"type": "E"}, [5], [emit("E"), "x"]])
def test_decision_takes_only_emits(bad: Any) -> None:
    """Item 6: ``Decision(state, 5)`` raised a raw TypeError."""
    with pytest.raises(InvalidHandlerResult):
        Decision(Tally(), bad)


def test_decision_state_must_be_a_model() -> None:
    with pytest.raises(InvalidHandlerResult):
        Decision({"n": 1})  # type: ignore[type-var]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"partitions": 0},
        {"partitions": -4},
        {"partitions": "16"},
        {"partitions": True},
        {"partitions": 2**20},
        {"inbox": "x"},
        {"retry": None},
        {"clock": None},
        {"rng": 5},
        {"cache_size": -1},
        {"deterministic_ids": "yes"},
    ],
)
def test_store_config_is_checked(kwargs: Any) -> None:
    """Item 6: ``StoreConfig(partitions=0)`` failed with ZeroDivisionError on first use."""
    with pytest.raises(InvalidConfig):
        StoreConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_delay": -1},
        {"base_delay": math.nan},
        {"max_delay": math.inf},
        {"max_attempts": 0},
        {"max_attempts": 2.5},
        {"max_attempts": "3"},
        {"base_delay": 1.0, "max_delay": 0.5},
    ],
)
def test_retry_policy_is_checked(kwargs: Any) -> None:
    with pytest.raises(InvalidConfig):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": -1},
        {"window": "many"},
        {"window": 1.5},
        {"window": True},
        {"max_above": 0},
        {"exact": "maybe"},
        {"exact": 1},
        {"unknown": 1},
    ],
)
def test_inbox_policy_is_checked(kwargs: Any) -> None:
    with pytest.raises(InvalidConfig):
        InboxPolicy(**kwargs)


def test_config_errors_are_value_and_type_errors() -> None:
    with pytest.raises(ValueError, match="partitions"):
        StoreConfig(partitions=0)
    with pytest.raises(TypeError, match="partitions"):
        StoreConfig(partitions="16")  # type: ignore[arg-type]
    assert issubclass(InvalidConfig, DocOutboxError)


def test_outcome_reports_gave_up_as_readme_says() -> None:
    """Item 10."""
    outcome: Outcome[Tally] = Outcome(Status.GAVE_UP, "a", 0, 10)
    assert outcome.gave_up and not outcome.applied and not outcome.duplicate
    assert not Outcome(Status.APPLIED, "a", 1, 1).gave_up


def test_oversize_create_writes_nothing(make_store: MakeStore) -> None:
    """Item 14: a create path checking twice the limit failed no test."""
    store = make_store(Tally)
    limit = store.backend.max_document_bytes
    with pytest.raises(DocumentTooLarge) as caught:
        store.create("big", Tally(notes={"blob": "x" * (limit + 1024)}))
    assert caught.value.size is not None and caught.value.size > limit
    assert store.load("big") is None


def test_values_nested_up_to_the_bound_are_stored(store: Any) -> None:
    """The bound leaves the envelope room within MongoDB's 100 levels: payloads, emits and
    states of ``MAX_NESTING`` levels are written and read back as they were."""
    deep = nested(MAX_NESTING - 1)  # under the "k" key of an object: MAX_NESTING levels
    message = Message(id="m-deep", type="T", payload={"k": deep})
    # A state is the first level, its field the second.
    state = Tally(notes={"k": nested(MAX_NESTING - 2)})
    outcome = store.handle("a", message, returning(state, emit("E", {"k": deep})))
    assert outcome.applied
    snapshot = store.load("a")
    assert snapshot.state == state
    assert snapshot.raw_outbox[-1]["payload"] == {"k": deep}


def test_accepted_models_round_trip_exactly(store: Any) -> None:
    rng = random.Random(5)
    notes = {"$op": {"a.b": [1, 2.5, None, True, "é\u2603"]}, "n": rng.random()}
    state = Tally(n=-7, notes=notes, blob="ü".encode())
    assert store.create("c", state).created
    assert store.get("c").state == state
    outcome = store.handle("c", Message(id="m", type="T"), returning(Tally(n=8, notes=notes)))
    assert outcome.applied
    assert store.get("c").state == Tally(n=8, notes=notes)


class Plain(BaseModel):
    x: float = 0.0


def test_a_plain_model_without_aggregate_base_works(make_store: MakeStore) -> None:
    store = make_store(Plain)
    store.create("p", Plain(x=1.5))
    with pytest.raises(InvalidPayload):
        store.handle("p", Message(id="m", type="T"), returning(Plain(x=math.nan)))
    assert store.get("p").state == Plain(x=1.5)
