"""Validation of messages, emits and aggregate IDs: typed errors before anything is written."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import BaseModel

from docoutbox import Aggregate, AggregateStore, Message, OutboxMessage, emit
from docoutbox.errors import InvalidAggregateId, InvalidMessage, InvalidPayload
from docoutbox.model import aggregate_type_of, check_aggregate_id, with_article
from docoutbox.testing import MemoryBackend


@pytest.mark.parametrize("good", ["a", "x" * 255, 0, -5, 2**63 - 1])
def test_scalar_ids_pass(good: object) -> None:
    assert check_aggregate_id(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        {"$ne": None},
        {"$gt": ""},
        ["a"],
        ("a",),
        None,
        True,
        False,
        1.0,
        b"a",
        "",
        "x" * 256,
        "a\x00b",
        2**63,
    ],
)
def test_non_scalar_ids_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidAggregateId):
        check_aggregate_id(bad)


def test_message_without_id_is_invalid_message() -> None:
    with pytest.raises(InvalidMessage):
        Message(type="T")  # type: ignore[call-arg]
    with pytest.raises(InvalidMessage):
        Message(id="", type="T")
    with pytest.raises(InvalidMessage):
        Message.parse({"type": "T"})
    with pytest.raises(InvalidMessage):
        Message.parse("not a mapping")


def test_errors_are_value_errors_too() -> None:
    with pytest.raises(ValueError, match="invalid Message"):
        Message.parse({"type": "T"})


@pytest.mark.parametrize(
    "payload",
    [{"a": object()}, {"a": {1, 2}}, {"a": float("nan")}, {"a": [float("inf")]}, {"a": b"x"}],
)
def test_unserializable_payloads_are_rejected(payload: dict[str, object]) -> None:
    with pytest.raises(InvalidPayload):
        emit("T", payload)  # type: ignore[arg-type]
    with pytest.raises(InvalidPayload):
        Message(id="m", type="T", payload=payload)  # type: ignore[arg-type]


def test_pydantic_payloads_are_dumped_to_json_data() -> None:
    class Body(BaseModel):
        when: datetime
        amount: int

    item = emit("T", Body(when=datetime(2026, 1, 1), amount=3))
    assert item.payload == {"when": "2026-01-01T00:00:00", "amount": 3}


def test_naive_datetimes_from_drivers_are_read_as_utc() -> None:
    entry = OutboxMessage.parse(
        {
            "id": "e",
            "type": "T",
            "payload": {},
            "created_at": datetime(2026, 1, 1),
            "seq": 1,
            "aggregate_id": "a",
            "aggregate_type": "A",
        }
    )
    assert entry.created_at.tzinfo is not None
    assert entry.to_message().source == "A/a"
    assert entry.to_message().seq == 1


def test_aggregate_type_names() -> None:
    class Plain(Aggregate):
        pass

    class Named(Aggregate):
        aggregate_type = "orders.Order"

    assert aggregate_type_of(Plain) == "Plain"
    assert aggregate_type_of(Named) == "orders.Order"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Inventory", "an Inventory"),
        ("Order", "an Order"),
        ("Account", "an Account"),
        ("Counter", "a Counter"),
        ("User", "a User"),
        ("Euro", "a Euro"),
        ("Umbrella", "an Umbrella"),
    ],
)
def test_messages_name_a_model_with_the_right_article(name: str, expected: str) -> None:
    assert with_article(name) == expected


def test_a_wrong_state_type_says_an_inventory() -> None:

    class Inventory(BaseModel):
        count: int = 0

    class Other(BaseModel):
        count: int = 0

    store = AggregateStore(MemoryBackend(), Inventory)
    with pytest.raises(InvalidPayload, match="state must be exactly an Inventory, got Other"):
        store.create("i", Other())  # type: ignore[arg-type]
    message = Message(id="m", type="Added", payload={"count": "many"})
    with pytest.raises(InvalidPayload, match="payload is not an Inventory"):
        message.payload_as(Inventory)
