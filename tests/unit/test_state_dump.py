"""A state's dump skips pydantic's type check only where that check cannot fire."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ConfigDict, Field, computed_field, field_serializer

from docoutbox import Aggregate, AggregateStore, Message
from docoutbox.errors import InvalidHandlerResult, InvalidInput, InvalidPayload
from docoutbox.store.dump import exactly_typed, plain_fields
from docoutbox.testing.memory import MemoryBackend


class Plain(Aggregate):
    n: int = 0
    label: str = ""
    ratio: float = 0.0
    flag: bool = False
    maybe: int | None = None


class WithAny(Aggregate):
    n: int = 0
    notes: dict[str, Any] = Field(default_factory=dict)


class Computed(Aggregate):
    n: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.n


class Serialized(Aggregate):
    n: int = 0

    @field_serializer("n")
    def _n(self, value: int) -> int:
        return value


class Open(Aggregate):
    model_config = ConfigDict(extra="allow")
    n: int = 0


def test_only_plain_models_skip_the_check() -> None:
    assert plain_fields(Plain) == (
        ("n", int, False),
        ("label", str, False),
        ("ratio", float, False),
        ("flag", bool, False),
        ("maybe", int, True),
    )
    for model in (WithAny, Computed, Serialized, Open):
        assert plain_fields(model) is None, model.__name__


def test_exact_types_only() -> None:
    fields = plain_fields(Plain)
    assert fields is not None
    assert exactly_typed(Plain().__dict__, fields)
    assert exactly_typed(Plain(maybe=3).__dict__, fields)
    for update in ({"n": "5"}, {"n": True}, {"ratio": 1}, {"flag": 1}, {"maybe": "3"}):
        assert not exactly_typed(Plain().model_copy(update=update).__dict__, fields), update
    assert not exactly_typed(Plain.model_construct(label="x").__dict__ | {"n": 1.0}, fields)
    missing = dict(Plain().__dict__)
    del missing["label"]
    assert not exactly_typed(missing, fields)
    assert not exactly_typed(Plain().model_copy(update={"other": 1}).__dict__, fields)


def test_exactly_typed_values_are_storable_too() -> None:
    """The fast path skips storable_problem: it refuses what that would refuse."""
    fields = plain_fields(Plain)
    assert fields is not None
    assert exactly_typed(Plain(label="é", ratio=1.5).__dict__, fields)
    for state in (Plain(label="\ud800"), Plain(ratio=math.nan), Plain(ratio=-math.inf)):
        assert not exactly_typed(state.__dict__, fields), state


@pytest.mark.parametrize(
    "state",
    [
        Plain(label="\udfff"),
        Plain(ratio=math.inf),
        Plain().model_copy(update={"other": "\ud800"}),
    ],
    ids=["surrogate", "inf", "unknown-key"],
)
def test_a_plain_state_that_cannot_be_stored_is_refused(state: Plain) -> None:
    store = AggregateStore(MemoryBackend(), Plain)
    store.create("a", Plain())
    with pytest.raises(InvalidInput):
        store.handle("a", Message(id="m", type="T"), lambda s, m: state)
    assert store.get("a").version == 0
    with pytest.raises(InvalidPayload):
        store.create("b", Plain(label="\ud800"))


@pytest.mark.parametrize("update", [{"n": "5"}, {"flag": 1}, {"maybe": "3"}, {"label": 7}], ids=str)
def test_a_plain_state_holding_another_type_is_refused(update: dict[str, Any]) -> None:
    """``"5"`` in an ``int`` field reads back as 5: only the dump's type check refuses it."""
    store = AggregateStore(MemoryBackend(), Plain)
    store.create("a", Plain())

    def handler(state: Plain, message: Message) -> Plain:
        return state.model_copy(update=update)

    with pytest.raises(InvalidHandlerResult):
        store.handle("a", Message(id="m", type="T"), handler)
    assert store.get("a").version == 0
    assert store.handle("a", Message(id="m", type="T"), lambda s, m: Plain(n=2)).applied
    assert store.get("a").state == Plain(n=2)


def test_a_plain_state_of_the_right_types_is_stored_as_dumped() -> None:
    backend = MemoryBackend()
    store = AggregateStore(backend, Plain)
    store.create("a", Plain())
    state = Plain(n=3, label="x", ratio=0.5, flag=True)
    assert store.handle("a", Message(id="m", type="T"), lambda s, m: state).applied
    assert backend.load("a")["state"] == state.model_dump(mode="json")
