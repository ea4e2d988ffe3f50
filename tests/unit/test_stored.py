"""The codec of stored values (compression, encryption, rotation) and upcasters, alone and
through the store on the memory backend: what is stored holds no plaintext value, what is
read back is the plain, current model."""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any

import pytest
from pydantic import Field

from docoutbox import Aggregate, AggregateStore, Decision, Message, StoreConfig, emit
from docoutbox.errors import (
    CorruptValue,
    DocumentTooLarge,
    InvalidConfig,
    MalformedDocument,
    UnknownCodec,
    UnknownKey,
)
from docoutbox.ports.codec import ValueCodec
from docoutbox.stored import AesGcm, Codec, Keyring, StoredValues, Upcasters, Zlib
from docoutbox.stored.values import open_entry
from docoutbox.testing.memory import MemoryBackend

SECRET = "Ada Lovelace, 12 Crescent Road"
KEY_1 = bytes(range(32))
KEY_2 = bytes(range(32, 64))


def keyring(current: str = "k1", **keys: bytes) -> Keyring:
    return Keyring(keys or {"k1": KEY_1}, current=current)


def crypto(current: str = "k1", **keys: bytes) -> Codec:
    return Codec(Zlib(), AesGcm(keyring(current, **keys)))


class Profile(Aggregate):
    name: str = ""
    notes: list[str] = Field(default_factory=list)


def rename(state: Profile, message: Message) -> Decision[Profile]:
    name = str(message.payload["name"])
    return Decision(
        Profile(name=name, notes=[*state.notes, name]),
        [emit("Renamed", {"name": name}, headers={"who": name})],
    )


def store(backend: MemoryBackend, **config: Any) -> AggregateStore[Profile]:
    return AggregateStore(backend, Profile, StoreConfig(**config))


def raw(backend: MemoryBackend) -> str:
    return json.dumps(backend.docs, default=str)


# -- the codec -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "codec",
    [Codec(Zlib()), Codec(AesGcm(keyring())), crypto(), Codec(AesGcm(keyring()), Zlib())],
    ids=["zlib", "aesgcm", "zlib+aesgcm", "aesgcm+zlib"],
)
@pytest.mark.parametrize(
    "value", [{}, {"name": SECRET}, {"x": "é" * 500, "n": [1, 2.5, None, True]}]
)
def test_a_value_reads_back_as_it_was(codec: Codec, value: dict[str, Any]) -> None:
    text = codec.encode(value)
    assert isinstance(text, str) and text.startswith("dx1:")
    assert codec.decode(text) == value


def test_the_encoded_form_names_its_steps_and_hides_the_value() -> None:
    text = crypto().encode({"name": SECRET})
    assert text.startswith("dx1:zlib+aesgcm:")
    assert "Lovelace" not in text


def test_encryption_uses_a_fresh_nonce_per_value() -> None:
    codec = Codec(AesGcm(keyring()))
    assert codec.encode({"a": 1}) != codec.encode({"a": 1})


def test_compression_shrinks_large_values_and_keeps_small_ones() -> None:
    codec = Codec(Zlib(min_size=16))
    big = {"text": "abc" * 1000}
    assert len(codec.encode(big)) < len(json.dumps(big)) // 10
    small = Zlib(min_size=16)
    assert small.encode(b"short") == b"\x00short"
    assert small.decode(small.encode(b"x" * 100)) == b"x" * 100


def test_rotation_reads_values_written_under_an_old_key() -> None:
    old = crypto("k1", k1=KEY_1).encode({"name": SECRET})
    rotated = crypto("k2", k1=KEY_1, k2=KEY_2)
    new = rotated.encode({"name": "new"})
    assert rotated.decode(old) == {"name": SECRET}
    assert rotated.decode(new) == {"name": "new"}
    with pytest.raises(UnknownKey, match="k2"):
        crypto("k1", k1=KEY_1).decode(new)


def test_a_key_under_the_same_id_but_different_bytes_does_not_decrypt() -> None:
    text = crypto("k1", k1=KEY_1).encode({"a": 1})
    with pytest.raises(CorruptValue, match="authentication"):
        crypto("k1", k1=KEY_2).decode(text)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("plain text", CorruptValue),
        ("dx1:zlib:", CorruptValue),
        ("dx1:zlib:!!!", CorruptValue),
        ("dx1:zlib:AkFB", CorruptValue),  # flag 2
        ("dx1:zlib:AUFB", CorruptValue),  # flag 1, not deflate
        ("dx1:zlib:AEFB", CorruptValue),  # raw, not JSON
        ("dx1:lz4:AEFB", UnknownCodec),
    ],
)
def test_bad_encoded_values_raise_typed_errors(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        Codec(Zlib()).decode(text)


def test_an_altered_ciphertext_fails_authentication() -> None:
    codec = Codec(AesGcm(keyring()))
    head, _, body = codec.encode({"a": 1}).rpartition(":")
    data = bytearray(base64.b64decode(body))
    data[-1] ^= 1
    with pytest.raises(CorruptValue):
        codec.decode(f"{head}:{base64.b64encode(bytes(data)).decode()}")
    data[1] ^= 1  # the key ID is authenticated too: "j1" is unknown first
    with pytest.raises(UnknownKey):
        codec.decode(f"{head}:{base64.b64encode(bytes(data)).decode()}")
    short = base64.b64encode(bytes([2]) + b"k1").decode()
    with pytest.raises(CorruptValue, match="short"):
        codec.decode(f"{head}:{short}")


def test_a_reader_decodes_steps_it_no_longer_writes_with() -> None:
    compressed = Codec(Zlib()).encode({"a": "b" * 500})
    assert Codec(AesGcm(keyring()), readers=[Zlib()]).decode(compressed) == {"a": "b" * 500}
    with pytest.raises(UnknownCodec, match="zlib"):
        Codec(AesGcm(keyring())).decode(compressed)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Codec(),
        lambda: Codec(Zlib(), Zlib()),
        lambda: Codec(object()),  # type: ignore[arg-type]
        lambda: Zlib(level=10),
        lambda: Zlib(min_size=-1),
        lambda: Keyring({}, "k1"),
        lambda: Keyring({"k 1": KEY_1}, "k 1"),
        lambda: Keyring({"k1": b"short"}, "k1"),
        lambda: Keyring({"k1": KEY_1}, "k2"),
        lambda: AesGcm({"k1": KEY_1}),  # type: ignore[arg-type]
        lambda: StoreConfig(codec=Zlib()),  # type: ignore[arg-type]
        lambda: StoreConfig(upcasters={}),  # type: ignore[arg-type]
    ],
)
def test_bad_codec_settings_are_refused(build: Any) -> None:
    with pytest.raises(InvalidConfig):
        build()


def test_a_step_with_a_bad_name_is_refused() -> None:
    class Bad:
        name = "Not OK"

        def encode(self, data: bytes) -> bytes:
            return data

        def decode(self, data: bytes) -> bytes:
            return data

    assert isinstance(Bad(), ValueCodec)
    with pytest.raises(InvalidConfig, match="name"):
        Codec(Bad())


def test_a_keyring_never_shows_its_keys() -> None:
    assert KEY_1.hex() not in repr(keyring()) and "k1" in repr(keyring())


# -- the store -----------------------------------------------------------------------------


def test_the_store_keeps_no_plaintext_value_and_reads_everything_back() -> None:
    backend = MemoryBackend()
    profiles = store(backend, codec=crypto())
    outcome = profiles.handle(
        "p-1", {"id": "m-1", "type": "Rename", "payload": {"name": SECRET}}, rename, create=True
    )
    assert outcome.applied and outcome.emitted[0].payload == {"name": SECRET}
    assert "Lovelace" not in raw(backend)
    doc = backend.docs["p-1"]
    assert isinstance(doc["state"], str) and isinstance(doc["outbox"][0]["payload"], str)
    assert isinstance(doc["outbox"][0]["headers"], str)
    # metadata stays plain
    entry = doc["outbox"][0]
    assert (entry["type"], entry["seq"], entry["aggregate_id"], doc["version"]) == (
        "Renamed",
        1,
        "p-1",
        1,
    )
    fresh = store(backend, codec=crypto())  # no cache: reads from the backend
    snapshot = fresh.get("p-1")
    assert snapshot.state == Profile(name=SECRET, notes=[SECRET])
    assert snapshot.outbox[0].payload == {"name": SECRET}
    assert snapshot.outbox[0].headers == {"who": SECRET}
    again = fresh.handle("p-1", {"id": "m-2", "type": "Rename", "payload": {"name": "B"}}, rename)
    assert again.state == Profile(name="B", notes=[SECRET, "B"])
    assert [e.seq for e in fresh.get("p-1").outbox] == [1, 2]
    assert fresh.handle(
        "p-1", {"id": "m-1", "type": "Rename", "payload": {"name": "X"}}, rename
    ).duplicate


def test_a_batch_and_a_create_are_encoded_too() -> None:
    backend = MemoryBackend()
    profiles = store(backend, codec=crypto())
    profiles.create("p-0", Profile(name=SECRET))
    messages = [{"id": f"m-{i}", "type": "Rename", "payload": {"name": SECRET}} for i in range(3)]
    outcome = profiles.handle_batch("p-1", messages, rename, create=True)
    assert all(r.applied for r in outcome.results)
    assert "Lovelace" not in raw(backend)
    fresh = store(backend, codec=crypto())
    assert fresh.get("p-0").state.name == SECRET
    assert [e.payload for e in fresh.get("p-1").outbox] == [{"name": SECRET}] * 3
    assert [p.aggregate_id for p in fresh.pending()] == ["p-1"]


def test_documents_written_before_the_codec_still_read() -> None:
    backend = MemoryBackend()
    store(backend).handle(
        "p-1", {"id": "m-1", "type": "Rename", "payload": {"name": "A"}}, rename, create=True
    )
    profiles = store(backend, codec=crypto())
    assert profiles.get("p-1").outbox[0].payload == {"name": "A"}
    profiles.handle("p-1", {"id": "m-2", "type": "Rename", "payload": {"name": SECRET}}, rename)
    assert "Lovelace" not in raw(backend)
    assert [e.payload["name"] for e in profiles.get("p-1").outbox] == ["A", SECRET]


def test_a_store_without_the_codec_refuses_encoded_documents_by_type() -> None:
    backend = MemoryBackend()
    store(backend, codec=crypto()).handle(
        "p-1", {"id": "m-1", "type": "Rename", "payload": {"name": "A"}}, rename, create=True
    )
    with pytest.raises(UnknownCodec):
        store(backend).get("p-1")
    snapshot = store(backend, codec=crypto()).get("p-1")
    with pytest.raises(UnknownCodec):
        open_entry(None, snapshot.raw_outbox[0])
    with pytest.raises(UnknownKey):
        store(backend, codec=crypto("k2", k2=KEY_2)).get("p-1")


def test_the_size_guard_measures_the_encoded_document() -> None:
    # Plain, this state is ~60 KB and the limit refuses it; compressed it fits.
    big = {"id": "m-1", "type": "Rename", "payload": {"name": "z" * 60_000}}
    with pytest.raises(DocumentTooLarge):
        store(MemoryBackend(max_document_bytes=100_000)).handle("p-1", big, rename, create=True)
    backend = MemoryBackend(max_document_bytes=100_000)
    assert store(backend, codec=Codec(Zlib())).handle("p-1", big, rename, create=True).applied
    # Encrypted without compression, a state that fits plain no longer does (base64).
    near = {"id": "m-1", "type": "Rename", "payload": {"name": "z" * 20_000}}
    assert (
        store(MemoryBackend(max_document_bytes=90_000))
        .handle("p-1", near, rename, create=True)
        .applied
    )
    with pytest.raises(DocumentTooLarge):
        store(MemoryBackend(max_document_bytes=90_000), codec=Codec(AesGcm(keyring()))).handle(
            "p-1", near, rename, create=True
        )


# -- upcasters -----------------------------------------------------------------------------


class ProfileV1(Aggregate):
    aggregate_type = "Profile"
    name: str = ""


class ProfileV3(Aggregate):
    aggregate_type = "Profile"
    first: str = ""
    last: str = ""
    tags: list[str] = Field(default_factory=list)


def v3_upcasters() -> Upcasters:
    upcasters = Upcasters()

    @upcasters.state("Profile", 1)
    def split(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old.pop("name").partition(" ")
        return {**old, "first": first, "last": last}

    @upcasters.state("Profile", 2)
    def tag(old: dict[str, Any]) -> dict[str, Any]:
        return {**old, "tags": []}

    @upcasters.payload("Renamed", 1)
    def full(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old["name"].partition(" ")
        return {"first": first, "last": last}

    return upcasters


def rename_v1(state: ProfileV1, message: Message) -> Decision[ProfileV1]:
    name = str(message.payload["name"])
    return Decision(ProfileV1(name=name), [emit("Renamed", {"name": name})])


def tag_v3(state: ProfileV3, message: Message) -> ProfileV3:
    return state.model_copy(update={"tags": [*state.tags, str(message.payload["tag"])]})


@pytest.mark.parametrize("codec", [None, crypto()], ids=["plain", "encrypted"])
def test_old_documents_read_back_as_the_current_model(codec: Codec | None) -> None:
    backend = MemoryBackend()
    old = AggregateStore(backend, ProfileV1, StoreConfig(codec=codec))
    old.handle(
        "p-1",
        {"id": "m-1", "type": "R", "payload": {"name": "Ada Lovelace"}},
        rename_v1,
        create=True,
    )
    assert "state_version" not in backend.docs["p-1"]
    new = AggregateStore(backend, ProfileV3, StoreConfig(codec=codec, upcasters=v3_upcasters()))
    snapshot = new.get("p-1")
    assert snapshot.state == ProfileV3(first="Ada", last="Lovelace")
    assert snapshot.outbox[0].payload == {"first": "Ada", "last": "Lovelace"}
    outcome = new.handle("p-1", {"id": "m-2", "type": "T", "payload": {"tag": "x"}}, tag_v3)
    assert outcome.state == ProfileV3(first="Ada", last="Lovelace", tags=["x"])
    assert backend.docs["p-1"]["state_version"] == 3
    # a fresh reader reads the version-3 state as it is (no upcaster runs on it)
    again = AggregateStore(backend, ProfileV3, StoreConfig(codec=codec, upcasters=v3_upcasters()))
    assert again.get("p-1").state.tags == ["x"]


def test_new_entries_carry_their_payload_version() -> None:
    backend = MemoryBackend()
    upcasters = v3_upcasters()

    def renamed(state: ProfileV3, message: Message) -> Decision[ProfileV3]:
        return Decision(state, [emit("Renamed", {"first": "A", "last": "B"}), emit("Other")])

    AggregateStore(backend, ProfileV3, StoreConfig(upcasters=upcasters)).handle(
        "p-1", {"id": "m-1", "type": "X"}, renamed, create=True
    )
    doc = backend.docs["p-1"]
    assert doc["state_version"] == 3
    assert [e.get("payload_version") for e in doc["outbox"]] == [2, None]
    assert AggregateStore(backend, ProfileV3, StoreConfig(upcasters=upcasters)).get("p-1").outbox[
        0
    ].payload == {"first": "A", "last": "B"}


def test_upcasting_never_changes_the_cached_document() -> None:
    values = StoredValues(upcasters=v3_upcasters())
    doc = {"type": "Profile", "state": {"name": "A B"}}
    assert values.open_state("Profile", doc) == {"first": "A", "last": "B", "tags": []}
    assert doc["state"] == {"name": "A B"}


@pytest.mark.parametrize(
    ("version", "match"),
    [(4, "newer"), (0, "no upcaster"), ("2", "version '2'")],
)
def test_versions_the_reader_cannot_upcast_are_refused(version: object, match: str) -> None:
    values = StoredValues(upcasters=v3_upcasters())
    doc = {"type": "Profile", "state": {"name": "A B"}, "state_version": version}
    with pytest.raises(MalformedDocument, match=match):
        values.open_state("Profile", doc)


def test_a_gap_in_the_steps_and_a_bad_result_are_refused() -> None:
    upcasters = Upcasters()
    upcasters.state("T", 1)(lambda old: old)
    upcasters.state("T", 3)(lambda old: old)
    with pytest.raises(MalformedDocument, match="version 2 has no upcaster"):
        upcasters.upcast_state("T", None, {})
    broken = Upcasters()
    broken.payload("E", 1)(lambda old: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(MalformedDocument, match="not a dict"):
        broken.upcast_payload("E", 1, {})
    with pytest.raises(MalformedDocument, match="not an object"):
        broken.upcast_payload("E", 1, [])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "register",
    [
        lambda u: u.state("", 1)(lambda o: o),
        lambda u: u.state("T", 0)(lambda o: o),
        lambda u: u.payload("T", True)(lambda o: o),
        lambda u: u.payload("T", 1)("not callable"),
        lambda u: (u.state("T", 1)(lambda o: o), u.state("T", 1)(lambda o: o)),
    ],
)
def test_bad_upcasters_are_refused(register: Any) -> None:
    with pytest.raises(InvalidConfig):
        register(Upcasters())


def test_a_created_aggregate_and_a_batch_stamp_the_state_version() -> None:
    backend = MemoryBackend()
    config = StoreConfig(upcasters=v3_upcasters())
    AggregateStore(backend, ProfileV3, config).create("p-0", ProfileV3(first="A"))
    assert backend.docs["p-0"]["state_version"] == 3
    old = AggregateStore(backend, ProfileV1, StoreConfig())
    old.handle(
        "p-1", {"id": "m-1", "type": "R", "payload": {"name": "A B"}}, rename_v1, create=True
    )
    messages = [{"id": f"t-{i}", "type": "T", "payload": {"tag": str(i)}} for i in range(2)]
    outcome = AggregateStore(backend, ProfileV3, config).handle_batch("p-1", messages, tag_v3)
    assert [r.applied for r in outcome.results] == [True, True]
    assert backend.docs["p-1"]["state_version"] == 3
    assert AggregateStore(backend, ProfileV3, config).get("p-1").state.tags == ["0", "1"]


def test_a_codec_pickles_with_its_keys_for_other_processes() -> None:
    codec = crypto("k2", k1=KEY_1, k2=KEY_2)
    text = codec.encode({"a": 1})
    copy = pickle.loads(pickle.dumps(codec))
    assert copy.decode(text) == {"a": 1} and copy.decode(copy.encode({"b": 2})) == {"b": 2}


def test_an_encrypted_value_copied_to_another_place_does_not_decrypt() -> None:
    backend = MemoryBackend()
    profiles = store(backend, codec=crypto())
    for aggregate in ("p-1", "p-2"):
        message = {"id": f"m-{aggregate}", "type": "Rename", "payload": {"name": aggregate}}
        profiles.handle(aggregate, message, rename, create=True)
    profiles.handle("p-1", {"id": "m-3", "type": "Rename", "payload": {"name": "x"}}, rename)
    one, two = backend.docs["p-1"], backend.docs["p-2"]
    two["state"] = one["state"]  # another document's state
    with pytest.raises(CorruptValue, match="copied"):
        store(backend, codec=crypto()).get("p-2")
    first, second = one["outbox"]
    second["payload"] = first["payload"]  # another entry's payload
    with pytest.raises(CorruptValue):
        store(backend, codec=crypto()).get("p-1").outbox  # noqa: B018 - decodes the entries
    first["headers"], first["payload"] = first["payload"], first["headers"]  # swapped fields
    with pytest.raises(CorruptValue):
        StoredValues(crypto()).open_entry(first)


def test_the_context_is_part_of_what_an_encrypted_value_authenticates() -> None:
    codec = crypto()
    text = codec.encode({"a": 1}, "here")
    assert codec.decode(text, "here") == {"a": 1}
    with pytest.raises(CorruptValue):
        codec.decode(text, "there")
    compressed = Codec(Zlib()).encode({"a": 1}, "here")  # nothing to authenticate with
    assert Codec(Zlib()).decode(compressed, "there") == {"a": 1}
