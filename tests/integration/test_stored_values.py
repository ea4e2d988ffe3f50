"""Encrypted, compressed and upcast stored values on every database backend (the MongoDB
wire server and the session's Cosmos DB account), read back raw from the database: no
plaintext payload, header or state value is stored, metadata stays plain, entries written
under a rotated key still read, and documents of the previous model version read back as
the current one."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any

import pytest

from docoutbox import Aggregate, AggregateStore, Decision, Message, StoreConfig, emit
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.errors import PermanentPublishError
from docoutbox.stored import AesGcm, Codec, Keyring, Upcasters, Zlib
from docoutbox.testing import MemoryBackend, MemoryDeadLetters, MemoryPublisher
from docoutbox_app.cli import main
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.kit import open_kit
from tests.support.backends import CONFIG, Bundle, DispatchEnv, wait_until

SECRET = "Ada Lovelace"
OLD_KEY = bytes(range(32))
NEW_KEY = bytes(range(100, 132))


def codec(current: str = "2026-05", **keys: bytes) -> Codec:
    return Codec(Zlib(), AesGcm(Keyring(keys or {"2026-05": OLD_KEY}, current=current)))


def rotated() -> Codec:
    return codec("2026-11", **{"2026-05": OLD_KEY, "2026-11": NEW_KEY})


class Patient(Aggregate):
    name: str = ""
    visits: int = 0


def visit(state: Patient, message: Message) -> Decision[Patient]:
    name = str(message.payload["name"])
    return Decision(
        Patient(name=name, visits=state.visits + 1),
        [emit("Visited", {"name": name, "note": "x" * 400}, headers={"who": name})],
    )


def raw_documents(bundle: Bundle) -> list[dict[str, Any]]:
    if bundle.kind == "mongo":
        return list(bundle.coll.find({}))
    return list(bundle.coll.query_items("SELECT * FROM c", enable_cross_partition_query=True))


def store(bundle: Bundle, model: type[Any] = Patient, **config: Any) -> AggregateStore[Any]:
    return AggregateStore(bundle.store_backend(), model, StoreConfig(**config))


def test_no_plaintext_value_is_stored_and_metadata_stays_plain(bundle: Bundle) -> None:
    patients = store(bundle, codec=codec())
    for i in range(3):
        message = {"id": f"m-{i}", "type": "Visit", "payload": {"name": SECRET}}
        assert patients.handle("p-1", message, visit, create=True).applied
    docs = raw_documents(bundle)
    text = json.dumps(docs, default=str)
    assert "Lovelace" not in text and '"note"' not in text and '"who"' not in text
    (doc,) = [d for d in docs if d.get("type") == "Patient"]
    assert isinstance(doc["state"], str) and doc["state"].startswith("dx1:zlib+aesgcm:")
    assert (
        doc["version"] == 3
        and doc["outbox_seq"] == 3
        and doc["inbox"]
        == [
            "m-0",
            "m-1",
            "m-2",
        ]
    )
    assert [(e["seq"], e["type"], e["attempts"]) for e in doc["outbox"]] == [
        (1, "Visited", 0),
        (2, "Visited", 0),
        (3, "Visited", 0),
    ]
    assert all(
        isinstance(e["payload"], str) and isinstance(e["headers"], str) for e in doc["outbox"]
    )
    snapshot = store(bundle, codec=codec()).get("p-1")
    assert snapshot.state == Patient(name=SECRET, visits=3)
    assert snapshot.outbox[0].payload["name"] == SECRET
    assert snapshot.outbox[0].headers == {"who": SECRET}
    assert [s.aggregate_id for s in store(bundle, codec=codec()).pending()] == ["p-1"]


def test_after_key_rotation_old_entries_still_read(bundle: Bundle) -> None:
    store(bundle, codec=codec()).handle(
        "p-1", {"id": "m-1", "type": "Visit", "payload": {"name": "old"}}, visit, create=True
    )
    patients = store(bundle, codec=rotated())
    patients.handle("p-1", {"id": "m-2", "type": "Visit", "payload": {"name": "new"}}, visit)
    (doc,) = raw_documents(bundle)
    keys = [e["payload"] for e in doc["outbox"]]
    assert len(set(keys)) == 2
    snapshot = store(bundle, codec=rotated()).get("p-1")
    assert [e.payload["name"] for e in snapshot.outbox] == ["old", "new"]
    assert snapshot.state == Patient(name="new", visits=2)


class PatientV1(Aggregate):
    aggregate_type = "Patient"
    name: str = ""


class PatientV2(Aggregate):
    aggregate_type = "Patient"
    first: str = ""
    last: str = ""


def upcasters() -> Upcasters:
    found = Upcasters()

    @found.state("Patient", 1)
    def split(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old.pop("name").partition(" ")
        return {**old, "first": first, "last": last}

    @found.payload("Named", 1)
    def split_payload(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old["name"].partition(" ")
        return {"first": first, "last": last}

    return found


def name_v1(state: PatientV1, message: Message) -> Decision[PatientV1]:
    return Decision(PatientV1(name=SECRET), [emit("Named", {"name": SECRET})])


def touch_v2(state: PatientV2, message: Message) -> Decision[PatientV2]:
    return Decision(state, [emit("Named", {"first": state.first, "last": state.last})])


def test_documents_of_the_previous_model_read_back_as_the_current_one(bundle: Bundle) -> None:
    store(bundle, PatientV1, codec=codec()).handle(
        "p-1", {"id": "m-1", "type": "Name"}, name_v1, create=True
    )
    current = store(bundle, PatientV2, codec=codec(), upcasters=upcasters())
    snapshot = current.get("p-1")
    assert snapshot.state == PatientV2(first="Ada", last="Lovelace")
    assert snapshot.outbox[0].payload == {"first": "Ada", "last": "Lovelace"}
    assert current.handle("p-1", {"id": "m-2", "type": "Touch"}, touch_v2).applied
    (doc,) = raw_documents(bundle)
    assert doc["state_version"] == 2
    assert [e.get("payload_version") for e in doc["outbox"]] == [None, 2]
    again = store(bundle, PatientV2, codec=codec(), upcasters=upcasters()).get("p-1")
    assert [e.payload for e in again.outbox] == [{"first": "Ada", "last": "Lovelace"}] * 2
    assert again.state == PatientV2(first="Ada", last="Lovelace")


def test_the_dispatcher_publishes_decoded_entries_of_both_keys(dispatch_env: DispatchEnv) -> None:
    """Entries written under the old key and under the current one, on every dispatcher
    driver: the broker gets the plain payloads and headers, and every entry is trimmed."""
    before = store(dispatch_env.bundle, codec=codec())
    after = store(dispatch_env.bundle, codec=rotated())
    for i in range(4):
        writer = before if i % 2 == 0 else after
        message = {"id": f"m-{i}", "type": "Visit", "payload": {"name": f"{SECRET} {i}"}}
        assert writer.handle(f"p-{i % 2}", message, visit, create=True).applied
    publisher = MemoryPublisher()
    dispatch_env.start(publisher, config=replace(CONFIG, codec=rotated()))
    wait_until(lambda: dispatch_env.pending() == 0 and len(publisher.published) == 4)
    names = sorted(str(e.payload["name"]) for e in publisher.published)
    assert names == [f"{SECRET} {i}" for i in range(4)]
    assert all(e.headers == {"who": e.payload["name"]} for e in publisher.published)


#: What ``--decode tests.integration.test_stored_values:ROTATED`` names.
ROTATED = rotated()


def test_a_refused_encrypted_entry_is_dead_lettered_encoded_and_replayed(
    mongo: Any, mongo_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the wire server: the dead letter holds the entry as stored (no plaintext); the
    command replays it with the stores' codec, sealed again under the current key, and a
    dispatcher then publishes it decoded."""
    patients = AggregateStore(MongoBackend(mongo["patients"]), Patient, StoreConfig(codec=codec()))
    message = {"id": "m-1", "type": "Visit", "payload": {"name": SECRET}}
    assert patients.handle("p-1", message, visit, create=True).applied
    kit = open_kit(mongo_uri, mongo.name, "patients")
    refused = MemoryPublisher(fail=lambda entry: PermanentPublishError("refused"))
    config = DispatcherConfig(name="stored-dlq", sweep_interval=0.2, grace=0, codec=ROTATED)
    dispatcher = Dispatcher(
        kit.backend, refused, kit.dead_letters, source=kit.source, checkpoints=kit.checkpoints,
        config=config,
    )  # fmt: skip
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    dead = mongo["docoutbox_dead_letters"]
    try:
        wait_until(lambda: dead.count_documents({}) == 1 and not patients.get("p-1").outbox)
    finally:
        dispatcher.stop()
        thread.join(15)
    (letter,) = list(dead.find({}))
    assert "Lovelace" not in json.dumps(letter, default=str)
    common = ["--mongo-uri", mongo_uri, "--db", mongo.name, "--collection", "patients"]
    capsys.readouterr()
    assert main(["dead-letters", "replay", *common, str(letter["_id"])]) == 2
    assert "replay it with the stores' codec" in capsys.readouterr().err
    decode = ["--decode", "tests.integration.test_stored_values:ROTATED"]
    assert main(["dead-letters", "replay", *common, *decode, str(letter["_id"])]) == 0
    assert "re-appended" in capsys.readouterr().out
    (doc,) = list(mongo["patients"].find({}))
    assert "Lovelace" not in json.dumps(doc, default=str)
    publisher = MemoryPublisher()
    config = replace(config, name="stored-dlq-2")
    again = Dispatcher(
        kit.backend, publisher, kit.dead_letters, source=kit.source, checkpoints=kit.checkpoints,
        config=config,
    )  # fmt: skip
    thread = threading.Thread(target=again.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(publisher.published) == 1)
    finally:
        again.stop()
        thread.join(15)
    (entry,) = publisher.published
    assert entry.payload["name"] == SECRET and entry.headers["docoutbox-replay-of"]
    assert entry.seq == 1


def test_a_dispatcher_missing_the_key_leaves_entries_pending_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not quarantined: the run fails with UnknownKey (logged), the entries stay pending,
    and a dispatcher given the key publishes them."""
    backend = MemoryBackend()
    writer = AggregateStore(backend, Patient, StoreConfig(codec=rotated()))
    message = {"id": "m-1", "type": "Visit", "payload": {"name": SECRET}}
    assert writer.handle("p-1", message, visit, create=True).applied
    dead = MemoryDeadLetters()
    publisher = MemoryPublisher()
    for config, done in [
        (
            DispatcherConfig.polling(0.05, codec=codec()),  # the old key only
            lambda: "UnknownKey" in caplog.text,
        ),
        (DispatcherConfig.polling(0.05, codec=rotated()), lambda: bool(publisher.published)),
    ]:
        dispatcher = Dispatcher(backend, publisher, dead, config=config)
        thread = threading.Thread(target=dispatcher.run, daemon=True)
        thread.start()
        try:
            wait_until(done)
        finally:
            dispatcher.stop()
            thread.join(15)
        if not publisher.published:
            assert "dispatch_run_failed" in caplog.text and not dead.entries
            assert len(backend.docs["p-1"]["outbox"]) == 1
    assert publisher.published[0].payload["name"] == SECRET and not dead.entries
    assert backend.docs["p-1"]["outbox"] == []
