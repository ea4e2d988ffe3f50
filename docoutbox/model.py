"""Data the library reads and writes: messages, outbox entries, inbox policy, aggregates."""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from docoutbox.errors import (
    InvalidAggregateId,
    InvalidConfig,
    InvalidInput,
    InvalidMessage,
    InvalidPayload,
)

M = TypeVar("M", bound=BaseModel)
AggregateId = str | int
JsonObject = dict[str, JsonValue]

MAX_ID_LENGTH = 255
#: Levels of dicts and lists a payload, header set or state may nest (the value itself is
#: the first). Stored inside a document (an outbox entry's payload sits three levels
#: down), it must stay within MongoDB's 100 levels; Cosmos DB allows 128.
MAX_NESTING = 90
_PAYLOAD_FIELDS = frozenset({"payload", "headers"})


#: Names starting with a vowel letter that sound like a consonant ("a User", "a Euro").
_CONSONANT_SOUNDS = ("uni", "use", "usu", "uti", "eu", "one", "once")


def with_article(name: str) -> str:
    """``name`` after "a" or "an", for messages: "an Inventory", "a Counter", "a User"."""
    lowered = name.lower()
    vowel = lowered[:1] in ("a", "e", "i", "o", "u") and not lowered.startswith(_CONSONANT_SOUNDS)
    return f"{'an' if vowel else 'a'} {name}"


def is_utf8(text: str) -> bool:
    """True when ``text`` can be stored: it encodes as UTF-8 (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def storable_problem(value: object, depth: int = MAX_NESTING) -> str | None:
    """What makes ``value`` impossible to store exactly, or None.

    Text must be UTF-8 (a lone surrogate such as ``"\\ud800"`` is not; drivers refuse it
    or rename it) and floats must be finite: JSON has no NaN or Infinity, and pydantic
    serializes them as ``null`` inside ``Any``-typed data, which would change the value
    silently. Complex numbers are refused wherever they are (a decision: JSON and BSON
    have none; pydantic stores ``1j`` as the text ``'1j'``, which an ``Any``-typed field
    reads back as a string). Walks dicts (keys too), lists, tuples, sets and pydantic
    models, at most ``depth`` levels of them (a value nested deeper cannot be stored: see
    :data:`MAX_NESTING`).

    This runs on every message and state, so plain leaves are checked inline.
    """
    kind = type(value)
    if kind is dict:
        if depth < 1:
            return _too_deep()
        items: Any = value.items()  # type: ignore[attr-defined]
        for key, sub in items:
            if type(key) is str:
                if not key.isascii() and not is_utf8(key):
                    return _bad_text(key)
            elif (problem := storable_problem(key, depth - 1)) is not None:
                return problem
            sub_kind = type(sub)
            if sub_kind is str:
                if not sub.isascii() and not is_utf8(sub):
                    return _bad_text(sub)
            elif sub_kind is int or sub_kind is bool or sub is None:
                continue
            elif (problem := storable_problem(sub, depth - 1)) is not None:
                return problem
        return None
    if kind is str:
        text: str = value  # type: ignore[assignment]
        return None if text.isascii() or is_utf8(text) else _bad_text(text)
    if kind is int or kind is bool or value is None:
        return None
    if kind is float:
        number: float = value  # type: ignore[assignment]
        return None if math.isfinite(number) else _bad_number(number)
    if isinstance(value, complex):
        return f"{value!r} is a complex number (JSON and BSON have none)"
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        if depth < 1:
            return _too_deep()
        elements: Any = value
        for sub in elements:
            sub_kind = type(sub)
            if sub_kind is str:
                if not sub.isascii() and not is_utf8(sub):
                    return _bad_text(sub)
            elif sub_kind is int or sub_kind is bool or sub is None:
                continue
            elif (problem := storable_problem(sub, depth - 1)) is not None:
                return problem
        return None
    if isinstance(value, BaseModel):
        problem = storable_problem(value.__dict__, depth)
        if problem is None and value.__pydantic_extra__:
            problem = storable_problem(value.__pydantic_extra__, depth)
        return problem
    if isinstance(value, str):
        return storable_problem(str(value))
    if isinstance(value, float):
        return storable_problem(float(value))
    if isinstance(value, dict):
        return storable_problem(dict(value), depth)
    if isinstance(value, list | tuple | set | frozenset):
        return storable_problem(list(value), depth)
    return None


def _too_deep() -> str:
    return f"the value is nested more than {MAX_NESTING} levels deep"


def _bad_text(text: str) -> str:
    return f"text {text!r} is not valid UTF-8"


def _bad_number(number: float) -> str:
    return f"{number!r} is not a finite number (JSON has no NaN or Infinity)"


def check_aggregate_id(aggregate_id: object) -> AggregateId:
    """Return ``aggregate_id`` if it is a plain scalar a database filter can use safely.

    Only non-empty UTF-8 strings and 64-bit integers are accepted, so an operator document
    such as ``{"$ne": None}`` can never reach a query filter.
    """
    kind = type(aggregate_id)
    if kind is str:
        text: str = aggregate_id  # type: ignore[assignment]
        if not text or len(text) > MAX_ID_LENGTH:
            raise InvalidAggregateId(
                f"aggregate id must have 1 to {MAX_ID_LENGTH} characters: {text!r}"
            )
        if "\x00" in text:
            raise InvalidAggregateId("aggregate id must not contain NUL")
        if not is_utf8(text):
            raise InvalidAggregateId(f"aggregate id {text!r} is not valid UTF-8")
        return text
    if kind is int:
        number: int = aggregate_id  # type: ignore[assignment]
        if not -(2**63) <= number < 2**63:
            raise InvalidAggregateId(f"aggregate id {number} does not fit in 64 bits")
        return number
    raise InvalidAggregateId(
        f"aggregate id must be a str or int, got {type(aggregate_id).__name__}"
    )


class _Strict(BaseModel):
    """A model whose validation errors surface as docoutbox's typed errors."""

    _invalid: ClassVar[type[InvalidInput]] = InvalidMessage

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self._typed(exc) from exc

    # Tells pydantic this __init__ only wraps errors: model_validate() then validates once
    # instead of calling __init__ (and validating again) from inside the validator.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def parse(cls, data: object) -> Any:
        """Validate ``data`` (a mapping or an instance) into this model, or raise typed."""
        if isinstance(data, cls):
            return data
        try:
            return cls.__pydantic_validator__.validate_python(data)  # model_validate(data)
        except ValidationError as exc:
            raise cls._typed(exc) from exc

    @classmethod
    def _typed(cls, exc: ValidationError) -> InvalidInput:
        errors = exc.errors()
        fields = {str(err["loc"][0]) for err in errors if err["loc"]}
        causes = [(err.get("ctx") or {}).get("error") for err in errors]
        kind = InvalidPayload if fields and fields <= _PAYLOAD_FIELDS else cls._invalid
        if causes and all(isinstance(cause, InvalidPayload) for cause in causes):
            kind = InvalidPayload
        return kind(f"invalid {cls.__name__}: {exc}")


def _json_object(value: object) -> object:
    if isinstance(value, BaseModel):
        problem = storable_problem(value)
        if problem:
            raise ValueError(problem)
        value = value.model_dump(mode="json")
    return value


def check_storable(texts: tuple[str | None, ...], payload: object, headers: object) -> None:
    """Raise unless every text is UTF-8 and the payload and headers are storable as given."""
    for text in texts:
        if text is not None and not text.isascii() and not is_utf8(text):
            raise InvalidMessage(_bad_text(text))
    problem = storable_problem(payload) if payload else None
    if problem is None and headers:
        problem = storable_problem(headers)
    if problem:
        raise InvalidPayload(problem)


class Message(_Strict):
    """An incoming message.

    ``source`` and ``seq`` identify the message within its producer's stream; when both
    are present, exact (watermark) de-duplication can be used instead of the ID window.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=512)
    type: str = Field(min_length=1, max_length=256)
    payload: JsonObject = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    correlation_id: str | None = None
    causation_id: str | None = None
    source: str | None = Field(default=None, min_length=1)
    seq: int | None = Field(default=None, ge=1)

    _payload_in = field_validator("payload", mode="before")(_json_object)

    @model_validator(mode="after")
    def _storable(self) -> Message:
        texts = (self.id, self.type, self.correlation_id, self.causation_id, self.source)
        check_storable(texts, self.payload, self.headers)
        return self

    def payload_as(self, model: builtins.type[M]) -> M:
        """The payload validated as ``model``; InvalidPayload if it does not fit."""
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise InvalidConfig(f"payload_as takes a pydantic model class, got {model!r}")
        try:
            return model.model_validate(self.payload)
        except ValidationError as exc:
            raise InvalidPayload(
                f"{self.type} {self.id}: payload is not {with_article(model.__name__)}: {exc}"
            ) from exc


#: The longest key of a scheduled entry.
MAX_KEY_LENGTH = 256
#: The furthest ahead an entry may be scheduled (``deliver_after``).
MAX_DELAY = timedelta(days=3650)


class Emit(_Strict):
    """An outgoing message a handler asks to send; the store seals it into the outbox.

    A *scheduled* emit (``deliver_at`` or ``deliver_after``) is published once it is due,
    not before; its ``key``, if any, lets a later handler of the same aggregate cancel it
    (:func:`cancel`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    _invalid: ClassVar[type[InvalidInput]] = InvalidMessage

    type: str = Field(min_length=1, max_length=256)
    payload: JsonObject = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    destination: str | None = None
    id: str | None = Field(default=None, min_length=1, max_length=512)
    deliver_at: datetime | None = None
    deliver_after: timedelta | None = None
    key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)

    _payload_in = field_validator("payload", mode="before")(_json_object)

    @model_validator(mode="after")
    def _storable(self) -> Emit:
        check_storable((self.type, self.destination, self.id, self.key), self.payload, self.headers)
        if self.deliver_at is not None:
            if self.deliver_after is not None:
                raise ValueError("give deliver_at or deliver_after, not both")
            if self.deliver_at.tzinfo is None:
                raise ValueError("deliver_at must be a timezone-aware datetime")
        if self.deliver_after is not None and not (timedelta(0) <= self.deliver_after <= MAX_DELAY):
            raise ValueError(f"deliver_after must be from 0 to {MAX_DELAY}")
        if self.key is not None and not self.scheduled:
            raise ValueError("a key is only for a scheduled emit (deliver_at or deliver_after)")
        return self

    @property
    def scheduled(self) -> bool:
        """Whether this emit is due later (``deliver_at`` or ``deliver_after``)."""
        return self.deliver_at is not None or self.deliver_after is not None

    def due(self, now: datetime) -> datetime | None:
        """When this emit falls due if committed at ``now`` (None: not scheduled)."""
        if self.deliver_at is not None:
            return self.deliver_at.astimezone(UTC)
        if self.deliver_after is not None:
            return now + self.deliver_after
        return None


def emit(
    type: str,
    payload: JsonObject | BaseModel | None = None,
    *,
    destination: str | None = None,
    headers: dict[str, str] | None = None,
    id: str | None = None,
    deliver_at: datetime | None = None,
    deliver_after: timedelta | float | None = None,
    key: str | None = None,
) -> Emit:
    """Describe an outgoing message. Pure: nothing is sent until the commit succeeds.

    ``deliver_at`` (an aware datetime) or ``deliver_after`` (a timedelta, or seconds)
    schedule it: it is published once due, never before. ``key`` names a scheduled
    message so that a later handler of the same aggregate can :func:`cancel` it.
    """
    if isinstance(deliver_after, int | float) and not isinstance(deliver_after, bool):
        if not math.isfinite(deliver_after):
            raise InvalidMessage(f"deliver_after must be finite, got {deliver_after!r}")
        deliver_after = timedelta(seconds=min(deliver_after, MAX_DELAY.total_seconds() + 1))
    return Emit(
        type=type,
        payload=payload if payload is not None else {},
        destination=destination,
        headers=headers if headers is not None else {},
        id=id,
        deliver_at=deliver_at,
        deliver_after=deliver_after,
        key=key,
    )


@dataclass(frozen=True, slots=True)
class Cancel:
    """A handler's request to cancel its aggregate's pending scheduled entry ``key``.

    Part of a :class:`~docoutbox.handlers.Decision`, written in the same conditional write
    as the rest of it. An entry already released for publishing (it fell due), published
    or never scheduled is not cancelled: the handler can tell beforehand from
    ``Context.scheduled``, and afterwards from ``Outcome.cancelled``.
    """

    key: str


def cancel(key: str) -> Cancel:
    """Cancel the pending scheduled entry ``key`` of the handled aggregate (pure)."""
    if type(key) is not str or not 1 <= len(key) <= MAX_KEY_LENGTH or not is_utf8(key):
        raise InvalidMessage(
            f"a key is UTF-8 text of 1 to {MAX_KEY_LENGTH} characters, got {key!r}"
        )
    return Cancel(key)


class OutboxMessage(_Strict):
    """An entry of a document's outbox: sealed and, once numbered, ready to publish.

    ``seq`` is None only for a scheduled entry not released yet: it is numbered when the
    dispatcher releases it, and published only then (:mod:`docoutbox.store.schedule`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    _invalid: ClassVar[type[InvalidInput]] = InvalidMessage

    id: str = Field(min_length=1)
    type: str = Field(min_length=1)
    payload: JsonObject
    headers: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    seq: int | None = Field(default=None, ge=1)
    aggregate_id: AggregateId
    aggregate_type: str
    correlation_id: str | None = None
    causation_id: str | None = None
    destination: str | None = None
    attempts: int = 0
    last_error: str | None = None

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # Drivers may return naive UTC datetimes (pymongo without tz_aware).
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    @property
    def source(self) -> str:
        """The producer stream this entry belongs to, as used by exact de-duplication."""
        return stream_name(self.aggregate_type, self.aggregate_id)

    def to_message(self) -> Message:
        """The message a receiver handles for this entry."""
        return Message(
            id=self.id,
            type=self.type,
            payload=self.payload,
            headers=self.headers,
            correlation_id=self.correlation_id,
            causation_id=self.causation_id,
            source=self.source,
            seq=self.seq,
        )


def stream_name(aggregate_type: str, aggregate_id: AggregateId) -> str:
    return f"{aggregate_type}/{aggregate_id}"


class InboxPolicy(_Strict):
    """How a document remembers which messages it has processed.

    ``window``: keep the IDs of the last ``window`` messages (0 disables the window).
    ``exact``: for messages that carry ``source`` and ``seq``, keep per source a high
    watermark plus the sparse sequence numbers seen above it. It is exact, needs O(sources)
    space while each receiver sees its sources' streams without permanent gaps, and
    tolerates reordering up to ``max_above`` outstanding numbers per source.
    ``spill``: IDs leaving the window (it is full, or the document nears its size limit)
    move to the store's inbox archive instead of being forgotten, and stay recognised
    (:mod:`docoutbox.store.spill`); the store's backend must have an archive.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    _invalid: ClassVar[type[InvalidInput]] = InvalidConfig

    window: int = Field(default=100, ge=0, le=100_000)
    exact: bool = False
    max_above: int = Field(default=1000, ge=1, le=1_000_000)
    spill: bool = False

    @model_validator(mode="after")
    def _spill_needs_window(self) -> InboxPolicy:
        if self.spill and self.window < 1:
            raise ValueError("spill=True needs an ID window (window >= 1)")
        return self


class Aggregate(BaseModel):
    """Convenience base for aggregate state. Any pydantic model works as state.

    Set ``aggregate_type`` on a subclass to name its documents' ``type`` field; by default
    it is the class name.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    aggregate_type: ClassVar[str] = ""


def aggregate_type_of(model: type[BaseModel]) -> str:
    name = getattr(model, "aggregate_type", "")
    return name if isinstance(name, str) and name else model.__name__
