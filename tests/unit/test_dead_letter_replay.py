"""The replay rules of ``docoutbox dead-letters`` (docoutbox.dispatch.tools.replay), on a store
kept in dicts: every ID is checked before anything changes, a replay keeps the entry's
seq under a new ID, and never appends over a pending entry with that seq."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from docoutbox.dispatch.tools.replay import GONE, DeadLetterAdmin, Replayed
from docoutbox.errors import InvalidInput, NotFound, UnknownKey
from docoutbox.model import AggregateId
from docoutbox.stored import AesGcm, Codec, Keyring, StoredValues, Zlib

NOW = datetime(2030, 1, 1, tzinfo=UTC)
KEY_OLD, KEY_NEW = bytes(range(32)), bytes(range(32, 64))


def entry(entry_id: str, seq: int, aggregate_id: str = "o1") -> dict[str, Any]:
    return {
        "id": entry_id,
        "type": "Placed",
        "payload": {},
        "created_at": NOW,
        "seq": seq,
        "aggregate_id": aggregate_id,
        "aggregate_type": "Order",
    }


class DictStore:
    def __init__(self, aggregates: str | None = "orders") -> None:
        self.aggregates = aggregates
        self.letters: dict[str, dict[str, Any]] = {}
        self.types: dict[AggregateId, str | None] = {"o1": "Order"}
        self.outboxes: dict[AggregateId, list[dict[str, Any]]] = {"o1": []}

    def quarantine(self, doc: dict[str, Any]) -> str:
        self.letters[doc["_id"]] = doc
        return str(doc["_id"])

    def listing(self, limit: int) -> list[dict[str, Any]]:
        return list(self.letters.values())[: limit or None]

    def count(self) -> int:
        return len(self.letters)

    def find(self, dead_letter_id: str) -> dict[str, Any] | None:
        return self.letters.get(dead_letter_id)

    def delete(self, ids: Sequence[str] | None) -> int:
        names = list(self.letters) if ids is None else [i for i in ids if i in self.letters]
        for name in names:
            del self.letters[name]
        return len(names)

    def aggregate_type(self, aggregate_id: AggregateId) -> object:
        return self.types.get(aggregate_id, GONE)

    def append(self, aggregate_id: AggregateId, item: dict[str, Any]) -> bool:
        outbox = self.outboxes[aggregate_id]
        if any(e["seq"] == item["seq"] for e in outbox):
            return False
        outbox.append(item)
        return True


def letter(entry_id: str, seq: int, aggregate_id: str = "o1") -> dict[str, Any]:
    return {
        "_id": entry_id,
        "aggregate_id": aggregate_id,
        "entry": entry(entry_id, seq, aggregate_id),
    }


def test_a_replay_appends_the_entry_with_its_seq_under_a_new_id_and_forgets_it() -> None:
    store = DictStore()
    name = store.quarantine(letter("e2", 2))
    [done] = DeadLetterAdmin(store).replay([name])
    [appended] = store.outboxes["o1"]
    assert appended["seq"] == 2 and appended["id"].startswith("e2~r") and appended["id"] != "e2"
    assert appended["headers"]["docoutbox-replay-of"] == "e2"
    assert (appended["attempts"], appended["last_error"]) == (0, None)
    assert done == Replayed("e2", "re-appended", f"orders/'o1' seq 2 as {appended['id']}")
    assert store.letters == {}


def test_a_replay_over_a_pending_seq_appends_nothing_and_says_so() -> None:
    store = DictStore()
    store.outboxes["o1"].append(entry("other", 2))
    name = store.quarantine(letter("e2", 2))
    [done] = DeadLetterAdmin(store).replay([name])
    assert done.action == "already pending" and len(store.outboxes["o1"]) == 1
    assert store.letters == {}


@pytest.mark.parametrize(
    ("bad", "error", "text"),
    [
        (letter("e9", 9, aggregate_id="gone"), NotFound, "no longer exists"),
        ({"_id": "m", "entry": {"id": "m"}}, InvalidInput, "malformed entry"),
        (
            {"_id": "s", "entry": {**letter("s", 3)["entry"], "payload": "dx1:zlib:AHt9"}},
            InvalidInput,
            "encoded by a store codec",
        ),
        (
            {"_id": "c", "origin": "consume", "queue": "q", "body": "{}"},
            InvalidInput,
            "needs a broker",
        ),
    ],
)
def test_every_id_is_checked_before_anything_changes(
    bad: dict[str, Any], error: type[Exception], text: str
) -> None:
    store = DictStore()
    good = store.quarantine(letter("e2", 2))
    store.quarantine(bad)
    with pytest.raises(error, match=text):
        DeadLetterAdmin(store).replay([good, bad["_id"]])
    assert store.outboxes["o1"] == [] and len(store.letters) == 2


def test_an_aggregate_of_another_type_is_refused() -> None:
    store = DictStore()
    store.types["o1"] = "Invoice"
    name = store.quarantine(letter("e2", 2))
    with pytest.raises(InvalidInput, match="is a Invoice"):
        DeadLetterAdmin(store).replay([name])
    store.types["o1"] = None  # a document without a type is taken as the entry's
    assert DeadLetterAdmin(store).replay([name])[0].action == "re-appended"


def test_an_outbox_dead_letter_needs_the_aggregates_named() -> None:
    store = DictStore(aggregates=None)
    name = store.quarantine(letter("e2", 2))
    with pytest.raises(InvalidInput, match="--collection"):
        DeadLetterAdmin(store).replay([name])


def test_a_consumer_dead_letter_is_republished_unchanged_then_forgotten() -> None:
    store = DictStore()
    name = store.quarantine({"_id": "c", "origin": "consume", "queue": "q", "body": "{}"})
    sent: list[tuple[str, bytes]] = []
    [done] = DeadLetterAdmin(store).replay([name], lambda q, b: sent.append((q, b)))
    assert sent == [("q", b"{}")] and done == Replayed("c", "republished", "queue q")
    assert store.letters == {}


def test_purge_checks_every_id_first_and_deletes_all_when_none_is_named() -> None:
    store = DictStore()
    for n in range(3):
        store.quarantine(letter(f"e{n}", n + 1))
    admin = DeadLetterAdmin(store)
    with pytest.raises(NotFound, match="nope"):
        admin.purge(["e0", "nope"])
    assert admin.count() == 3
    assert admin.purge(["e0"]) == 1 and admin.purge() == 2 and admin.count() == 0
    with pytest.raises(InvalidInput, match="at least one"):
        admin.replay([])


def test_an_encoded_entry_is_replayed_sealed_again_under_the_current_key() -> None:
    old = Codec(Zlib(), AesGcm(Keyring({"old": KEY_OLD}, current="old")))
    new = StoredValues(Codec(Zlib(), AesGcm(Keyring({"old": KEY_OLD, "new": KEY_NEW}, "new"))))
    sealed = StoredValues(old).seal_entry(
        {**entry("e2", 2), "payload": {"name": "Ada Lovelace"}, "headers": {"who": "Ada"}}
    )
    store = DictStore()
    name = store.quarantine({"_id": "e2", "aggregate_id": "o1", "entry": sealed})
    with pytest.raises(InvalidInput, match="replay it with the stores' codec"):
        DeadLetterAdmin(store).replay([name])
    [done] = DeadLetterAdmin(store, new).replay([name])
    [appended] = store.outboxes["o1"]
    assert done.action == "re-appended" and "Lovelace" not in str(appended)
    assert ":" in appended["payload"] and appended["payload"] != sealed["payload"]
    opened = new.open_entry(appended)
    assert opened["payload"] == {"name": "Ada Lovelace"} and opened["seq"] == 2
    assert opened["headers"]["who"] == "Ada" and opened["headers"]["docoutbox-replay-of"] == "e2"
    with pytest.raises(UnknownKey):  # written under the current key, not the old one
        StoredValues(old).open_entry(appended)
