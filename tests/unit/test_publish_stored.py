"""The per-document dispatch flow over stored values, driven by hand: encoded entries are
published decoded and upcast, poison is quarantined as stored (never as plaintext), and a
codec or key the dispatcher lacks stops the flow instead of quarantining."""

from __future__ import annotations

from typing import Any

import pytest

from docoutbox.dispatch.engine.flow import Publish, Quarantine
from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.errors import InvalidConfig, PermanentPublishError, UnknownCodec, UnknownKey
from docoutbox.model import OutboxMessage
from docoutbox.stored import AesGcm, Codec, Keyring, StoredValues, Upcasters, Zlib
from tests.support.dispatch_flow import document_run, entry

KEYS = {"k1": bytes(range(32)), "k2": bytes(range(32, 64))}
SECRET = {"name": "Ada Lovelace"}


def codec(current: str = "k1", keys: dict[str, bytes] = KEYS) -> Codec:
    return Codec(Zlib(), AesGcm(Keyring(keys, current)))


def stored(seq: int, values: StoredValues, payload: dict[str, Any] = SECRET) -> dict[str, Any]:
    return values.seal_entry(entry(seq, type="Named", payload=payload, headers={"who": "Ada"}))


def drive(
    doc: dict[str, Any], values: StoredValues | None, fail: frozenset[str] = frozenset()
) -> Any:
    def publish(sent: OutboxMessage) -> None:
        if sent.id in fail:
            raise PermanentPublishError("refused")

    return document_run(doc, values=values, publish=publish)


def test_entries_are_published_decoded_whatever_key_wrote_them() -> None:
    old = StoredValues(codec("k1"))
    new = StoredValues(codec("k2"))
    doc = {"_id": "a", "outbox": [stored(1, old), stored(2, new)]}
    assert all(isinstance(e["payload"], str) for e in doc["outbox"])
    ops, result = drive(doc, new)
    assert [op.entry.payload for op in ops if isinstance(op, Publish)] == [SECRET, SECRET]
    assert [op.entry.headers for op in ops if isinstance(op, Publish)] == [{"who": "Ada"}] * 2
    assert result.published == ["e1", "e2"] and result.trimmed


def test_a_refused_entry_is_quarantined_as_stored() -> None:
    values = StoredValues(codec())
    doc = {"_id": "a", "outbox": [stored(1, values), stored(2, values)]}
    ops, result = drive(doc, values, fail=frozenset({"e1"}))
    (dead,) = [op for op in ops if isinstance(op, Quarantine)]
    assert dead.entry == doc["outbox"][0] and "Lovelace" not in str(dead.entry)
    assert result.quarantined == ["e1"] and result.published == ["e2"]


def test_a_refused_plain_entry_is_quarantined_as_before() -> None:
    values = StoredValues(upcasters=Upcasters())
    doc = {"_id": "a", "outbox": [stored(1, values)]}
    ops, _ = drive(doc, values, fail=frozenset({"e1"}))
    (dead,) = [op for op in ops if isinstance(op, Quarantine)]
    assert dead.entry["payload"] == SECRET and dead.attempts == 1


def test_a_corrupt_entry_is_quarantined_and_the_rest_flow() -> None:
    values = StoredValues(codec())
    bad = stored(1, values)
    bad["payload"] = bad["payload"][:-8] + "AAAAAAA="
    doc = {"_id": "a", "outbox": [bad, stored(2, values)]}
    ops, result = drive(doc, values)
    (dead,) = [op for op in ops if isinstance(op, Quarantine)]
    assert dead.entry == bad and "malformed entry" in dead.error
    assert result.quarantined == ["e1"] and result.published == ["e2"]


@pytest.mark.parametrize(
    ("reader", "error"),
    [(None, UnknownCodec), (StoredValues(codec("k1", {"k1": KEYS["k1"]})), UnknownKey)],
)
def test_a_missing_codec_or_key_stops_the_flow(
    reader: StoredValues | None, error: type[Exception]
) -> None:
    doc = {"_id": "a", "outbox": [stored(1, StoredValues(codec("k2")))]}
    with pytest.raises(error):
        drive(doc, reader)


def test_old_payloads_are_published_upcast() -> None:
    upcasters = Upcasters()

    @upcasters.payload("Named", 1)
    def split(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old["name"].partition(" ")
        return {"first": first, "last": last}

    written = StoredValues(codec())  # before the upcaster existed: version 1, no field
    reader = StoredValues(codec(), upcasters)
    doc = {
        "_id": "a",
        "outbox": [stored(1, written), stored(2, reader, {"first": "B", "last": "C"})],
    }
    assert doc["outbox"][1]["payload_version"] == 2
    ops, _ = drive(doc, reader)
    assert [op.entry.payload for op in ops if isinstance(op, Publish)] == [
        {"first": "Ada", "last": "Lovelace"},
        {"first": "B", "last": "C"},
    ]


def test_the_dispatcher_config_refuses_a_wrong_codec() -> None:
    with pytest.raises(InvalidConfig):
        DispatcherConfig(codec=Zlib())  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig):
        DispatcherConfig(upcasters=object())  # type: ignore[arg-type]
