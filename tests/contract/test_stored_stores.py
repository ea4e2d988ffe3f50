"""Encoded and versioned stored values through every store adapter, sync and async, of the
matrix in tests/conftest.py: what one store writes under a key, a store holding that key
(and newer ones) reads back as the current model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from docoutbox import Aggregate, Decision, Message, StoreConfig, emit
from docoutbox.stored import AesGcm, Codec, Keyring, Upcasters, Zlib

MakeStore = Callable[..., Any]
OLD, NEW = bytes(range(32)), bytes(range(64, 96))


class Note(Aggregate):
    text: str = ""


class NoteV2(Aggregate):
    aggregate_type = "Note"
    words: list[str] = []  # noqa: RUF012 - pydantic copies defaults


def write(note: Note, message: Message) -> Decision[Note]:
    text = str(message.payload["text"])
    return Decision(Note(text=text), emit("Written", {"text": text}, headers={"by": text}))


def upcasters() -> Upcasters:
    found = Upcasters()
    found.state("Note", 1)(lambda old: {"words": old["text"].split()})
    return found


def test_values_round_trip_across_a_key_rotation(make_store: MakeStore) -> None:
    old = Codec(Zlib(), AesGcm(Keyring({"old": OLD}, current="old")))
    new = Codec(Zlib(), AesGcm(Keyring({"old": OLD, "new": NEW}, current="new")))
    first = make_store(Note, StoreConfig(codec=old))
    message = {"id": "m-1", "type": "Write", "payload": {"text": "dear diary"}}
    assert first.handle("n-1", message, write, create=True).applied
    second = make_store(Note, StoreConfig(codec=new, cache_size=0))
    message = {"id": "m-2", "type": "Write", "payload": {"text": "second page"}}
    assert second.handle("n-1", message, write).applied
    snapshot = second.get("n-1")
    assert snapshot.state == Note(text="second page") and snapshot.version == 2
    assert [(e.payload["text"], e.headers["by"]) for e in snapshot.outbox] == [
        ("dear diary", "dear diary"),
        ("second page", "second page"),
    ]
    current = make_store(NoteV2, StoreConfig(codec=new, upcasters=upcasters()))
    assert current.get("n-1").state == NoteV2(words=["second", "page"])
    assert [s.aggregate_id for s in current.pending()] == ["n-1"]
