"""The one place stored documents and entries are encoded, decoded and upcast.

Rule: what the store writes goes through :meth:`StoredValues.seal_state` and
:meth:`StoredValues.seal_entry`; what anything reads back (the store, the dispatcher, the
audit and export readers) goes through :meth:`StoredValues.open_state`,
:func:`open_entry` and :meth:`StoredValues.open_document`. Only values change: the state,
and each entry's ``payload`` and ``headers`` (headers are user data too, trace context
included); every other field is left exactly as it is. An encoded value found by a
reader given no codec raises :class:`~docoutbox.errors.UnknownCodec`: it is never taken
for a malformed document.

Each value is encoded for its place (:func:`state_context`, :func:`entry_context`), which
an encrypting step authenticates: a value copied to another document, entry or field
does not decode there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from docoutbox.errors import InvalidConfig, UnknownCodec
from docoutbox.stored.codec import Codec
from docoutbox.stored.reference import claim_of, envelope
from docoutbox.stored.upcast import PAYLOAD_VERSION, STATE_VERSION, Upcasters

#: The fields of an outbox entry that are values (encoded when a codec is set).
ENTRY_VALUES = ("payload", "headers")


@dataclass(frozen=True)
class StoredValues:
    """A codec and upcasters, as one store, dispatcher or reader applies them."""

    codec: Codec | None = None
    upcasters: Upcasters | None = None

    def __post_init__(self) -> None:
        if self.codec is not None and not isinstance(self.codec, Codec):
            raise InvalidConfig(
                f"codec must be a docoutbox.stored.Codec, got {type(self.codec).__name__}"
            )
        if self.upcasters is not None and not isinstance(self.upcasters, Upcasters):
            raise InvalidConfig(
                f"upcasters must be a docoutbox.stored.Upcasters, "
                f"got {type(self.upcasters).__name__}"
            )

    @classmethod
    def of(cls, codec: Codec | None, upcasters: Upcasters | None) -> StoredValues | None:
        """The values to apply, or None when there is nothing to apply (the plain path)."""
        if codec is None and upcasters is None:
            return None
        return cls(codec, upcasters)

    # -- writes ------------------------------------------------------------------------

    def seal_state(
        self, aggregate_type: str, aggregate_id: object, state: dict[str, Any]
    ) -> tuple[Any, int | None]:
        """The stored form of a state in plain form, and the state version to stamp
        (None: none)."""
        version = None if self.upcasters is None else self.upcasters.state_version(aggregate_type)
        if self.codec is None:
            return state, version
        return self.codec.encode(state, state_context(aggregate_type, aggregate_id)), version

    def seal_entry(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A new outbox entry (plain, as sealed by the store) in stored form."""
        sealed = dict(entry)
        if self.upcasters is not None:
            version = self.upcasters.payload_version(str(entry.get("type")))
            if version is not None:
                sealed[PAYLOAD_VERSION] = version
        codec = self.codec
        if codec is not None:
            sealed["payload"] = codec.encode(
                entry.get("payload", {}), entry_context(entry, "payload")
            )
            if entry.get("headers"):
                sealed["headers"] = codec.encode(entry["headers"], entry_context(entry, "headers"))
        return sealed

    # -- reads -------------------------------------------------------------------------

    def open_state(self, aggregate_type: str, doc: dict[str, Any]) -> Any:
        """The state of a stored document, decoded and upcast to the current version."""
        value = self._decoded(doc["state"], state_context(aggregate_type, doc.get("_id")))
        if self.upcasters is not None:
            value = self.upcasters.upcast_state(aggregate_type, doc.get(STATE_VERSION), value)
        return value

    def open_entry(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A stored outbox entry with its values decoded and its payload upcast."""
        opened = dict(entry)
        for name in ENTRY_VALUES:
            if isinstance(entry.get(name), str):
                opened[name] = self._decoded(entry[name], entry_context(entry, name))
        if self.upcasters is not None and isinstance(opened.get("payload"), dict):
            opened["payload"] = self.upcasters.upcast_payload(
                str(entry.get("type")), entry.get(PAYLOAD_VERSION), opened["payload"]
            )
        return opened

    def open_document(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A whole stored document with its state and entries opened (for readers)."""
        opened = dict(doc)
        if "state" in doc:
            opened["state"] = self.open_state(str(doc.get("type")), doc)
        outbox = doc.get("outbox")
        if isinstance(outbox, list):
            opened["outbox"] = [open_entry(self, e) for e in outbox]
        return opened

    def _decoded(self, value: Any, context: str) -> Any:
        if not isinstance(value, str):
            return value
        if self.codec is None:
            raise _no_codec()
        return self.codec.decode(value, context)


def state_context(aggregate_type: str, aggregate_id: object) -> str:
    """Where a state is stored: its aggregate (an ID is taken as text, as every reader,
    the Spark readers included, can give it)."""
    return f"docoutbox/{aggregate_type}/{aggregate_id}/state"


def entry_context(entry: dict[str, Any], field: str) -> str:
    """Where an entry's value is stored: its aggregate, its entry ID and the field."""
    return (
        f"docoutbox/{entry.get('aggregate_type')}/{entry.get('aggregate_id')}/"
        f"{entry.get('id')}/{field}"
    )


def open_entry(values: StoredValues | None, entry: Any) -> Any:
    """``entry`` opened by ``values``; with none, ``entry`` itself, unless it holds an
    encoded value (:class:`~docoutbox.errors.UnknownCodec`). Not a dict: as is. A
    claim-checked entry not resolved (:mod:`docoutbox.stored.claim`): its payload is
    the reference envelope."""
    if not isinstance(entry, dict):
        return entry
    if "payload" not in entry and claim_of(entry) is not None:
        # Claim-checked and not resolved: the payload reads as its reference.
        opened = open_entry(values, {**entry, "payload": None})
        opened["payload"] = envelope(entry, entry_context(entry, "payload"))
        return opened
    if values is not None:
        return values.open_entry(entry)
    if isinstance(entry.get("payload"), str) or isinstance(entry.get("headers"), str):
        raise _no_codec()
    return entry


def _no_codec() -> UnknownCodec:
    return UnknownCodec(
        "a stored value is encoded and this reader has no codec: give it the Codec "
        "(and keyring) the writer uses"
    )
