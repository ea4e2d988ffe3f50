"""Benchmark: the cost per message of encoding stored values, as ratios against plain.

Four stores differ only in ``StoreConfig.codec``: none (the plain path), ``Zlib()``,
``AesGcm`` (AES-256-GCM) and ``Zlib()`` then ``AesGcm``. Each message updates a customer
record (a state of about 1 KB of JSON) and emits one entry (a payload of about 600 bytes),
so each commit encodes one state and one payload, and the dispatcher decodes one entry.

- ``handle``: ``store.handle`` on the wire server, and in memory with no storage cost at
  all (:class:`DirectBackend`: the store's work and the codec's only); before each round,
  untimed, every outbox is emptied, as a dispatcher keeping up would. In memory, rounds of
  15 and of 75 messages per aggregate: past 64 pending entries the store's cache lets a
  document go, and each commit measures the whole document (a JSON encoding of every
  pending entry, cheaper for one encoded string than for the plain object);
- ``dispatch flow``: the per-document dispatch flow (decode, parse, publish to a list,
  trim plan) over documents of 10 pending entries, in memory;
- ``stored bytes``: the size of one document with one pending entry, encoded.
"""

from __future__ import annotations

import itertools
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    Scale,
    Table,
    connect,
    interleaved,
    median,
    new_collection,
    paired_ratio,
    ratio_range,
)
from docoutbox import Aggregate, AggregateStore, Decision, Message, StoreConfig, emit
from docoutbox.dispatch.engine.flow import DispatchPolicy, Publish, dispatch_document
from docoutbox.store.core import Write
from docoutbox.store.plans import apply_plan
from docoutbox.stored import AesGcm, Codec, Keyring, StoredValues, Zlib
from docoutbox.testing import MemoryBackend
from docoutbox.testing.memory import json_size
from docoutbox_mongo import MongoBackend

KEYRING = Keyring({"bench": bytes(range(32))}, current="bench")
CODECS: dict[str, Codec | None] = {
    "plain": None,
    "zlib": Codec(Zlib()),
    "aesgcm": Codec(AesGcm(KEYRING)),
    "zlib+aesgcm": Codec(Zlib(), AesGcm(KEYRING)),
}


class Customer(Aggregate):
    name: str = "Ada Lovelace"
    email: str = "ada@example.org"
    address: dict[str, str] = {  # noqa: RUF012 - pydantic copies defaults
        "street": "12 Crescent Road",
        "city": "London",
        "postcode": "NW1 4NP",
        "country": "United Kingdom",
    }
    preferences: dict[str, bool] = {f"channel_{i}": i % 2 == 0 for i in range(12)}  # noqa: RUF012
    history: list[str] = [  # noqa: RUF012
        f"order-{i:06d} delivered to the customer's home address" for i in range(12)
    ]
    visits: int = 0


def update(customer: Customer, message: Message) -> Decision[Customer]:
    changed = customer.model_copy(update={"visits": customer.visits + 1})
    payload: dict[str, Any] = {
        "customer": customer.name,
        "email": customer.email,
        "address": customer.address,
        "visits": changed.visits,
        "items": [{"sku": f"SKU-{i:04d}", "quantity": i, "note": "gift wrap"} for i in range(6)],
    }
    return Decision(changed, emit("CustomerUpdated", payload))


def _handle_round(
    store: AggregateStore[Customer], ids: list[str], count: int
) -> Callable[[], None]:
    serial = itertools.count()

    def work() -> None:
        for n in range(count):
            number = next(serial)
            aggregate = ids[n % len(ids)]
            store.handle(aggregate, {"id": f"m-{number}", "type": "Update"}, update)

    return work


def _rate(work: Callable[[], Any], count: int, before: Callable[[], None]) -> Callable[[], float]:
    def round_() -> float:
        before()
        start = time.perf_counter()
        work()
        return count / (time.perf_counter() - start)

    return round_


def _stores(backends: dict[str, Any], ids: list[str]) -> dict[str, AggregateStore[Customer]]:
    stores = {}
    for name, backend in backends.items():
        store = AggregateStore(backend, Customer, StoreConfig(codec=CODECS[name]))
        for aggregate in ids:
            store.create(aggregate, Customer())
        stores[name] = store
    return stores


def _ratios(samples: dict[str, list[float]]) -> dict[str, Any]:
    base = samples["plain"]
    return {
        name: {
            "ratio": paired_ratio(values, base),
            "iqr": ratio_range(values, base),
            "rate": median(values),
        }
        for name, values in samples.items()
    }


def _add(table: Table, what: str, figures: dict[str, Any]) -> None:
    for name, figure in figures.items():
        table.add(
            what, name, figure["rate"], figure["ratio"], "{:.2f}-{:.2f}".format(*figure["iqr"])
        )


class DirectBackend(MemoryBackend):
    """The testing backend without its deep copies, which cost more than the codec and
    cost less for an encoded value (one string) than for a plain one (nested objects):
    the store's own work and the codec's, with no storage cost at all."""

    def load(self, aggregate_id: Any) -> Any:
        return self.docs.get(aggregate_id)

    def write(self, plan: Any) -> bool:
        after = apply_plan(self.docs.get(plan.aggregate_id), plan)
        if after is None:
            return False
        self.docs[plan.aggregate_id] = after
        return True


def _memory_emptier(backend: MemoryBackend) -> Callable[[], None]:
    def empty() -> None:
        for doc in backend.docs.values():
            doc["outbox"] = []

    return empty


def _wire_emptier(coll: Any) -> Callable[[], None]:
    def empty() -> None:
        coll.update_many({}, {"$set": {"outbox": []}})

    return empty


def _flow_round(doc: dict[str, Any], values: StoredValues | None, docs: int) -> Callable[[], None]:
    policy, rng = DispatchPolicy(), random.Random(1)

    def work() -> None:
        for _ in range(docs):
            flow = dispatch_document(doc, policy, rng, values)
            send: Any = None
            published = []
            while True:
                try:
                    op = flow.send(send)
                except StopIteration:
                    break
                send = None
                if isinstance(op, Publish):
                    published.append(op.entry)
                elif isinstance(op, Write):
                    send = True
            assert len(published) == len(doc["outbox"])

    return work


def _progress(stage: str) -> None:
    print(f"[bench] codec: {stage} measured", file=sys.stderr, flush=True)


def run(uri: str, scale: Scale) -> Table:
    table = Table(
        "codec",
        "Encoding stored values vs the plain path (ratio of throughputs; 1.00 = no cost)",
        ["what", "codec", "ops/s", "vs plain", "IQR"],
    )
    ids = [f"c-{i}" for i in range(scale.aggregates)]
    client = connect(uri)
    try:
        colls = {name: new_collection(client, f"codec_{i}") for i, name in enumerate(CODECS)}
        stores = _stores({n: MongoBackend(c) for n, c in colls.items()}, ids)
        rounds = {
            name: _rate(
                _handle_round(stores[name], ids, scale.messages),
                scale.messages,
                _wire_emptier(colls[name]),
            )
            for name in CODECS
        }
        figures = _ratios(interleaved(rounds, scale.rounds, scale.warmup))
        _add(table, "handle, wire server", figures)
        table.figures["handle_wire"] = figures
        _progress("handle_wire")
        for coll in colls.values():
            coll.drop()

        memory = {name: DirectBackend() for name in CODECS}
        stores = _stores(memory, ids)
        for label, count in (("", scale.messages), ("_backlog", scale.messages * 5)):
            rounds = {
                name: _rate(
                    _handle_round(stores[name], ids, count), count, _memory_emptier(memory[name])
                )
                for name in CODECS
            }
            figures = _ratios(interleaved(rounds, scale.rounds, scale.warmup))
            pending = count // len(ids)
            _add(table, f"handle, in memory, up to {pending} pending per aggregate", figures)
            table.figures[f"handle_memory{label}"] = figures
            _progress(f"handle_memory{label}")

        sizes: dict[str, int] = {}
        flows = {}
        docs = max(10, scale.messages)
        for name, backend in memory.items():
            store = AggregateStore(backend, Customer, StoreConfig(codec=CODECS[name]))
            store.create("size", Customer())
            store.handle("size", {"id": "s-1", "type": "Update"}, update)
            sizes[name] = json_size(backend.docs["size"])
            for n in range(2, 11):
                store.handle("size", {"id": f"s-{n}", "type": "Update"}, update)
            doc = backend.load("size")
            assert doc is not None and len(doc["outbox"]) == 10
            values = StoredValues.of(CODECS[name], None)
            flows[name] = _rate(_flow_round(doc, values, docs), docs * 10, lambda: None)
        figures = _ratios(interleaved(flows, scale.rounds, scale.warmup))
        _add(table, "dispatch flow per entry, in memory", figures)
        table.figures["dispatch_flow_memory"] = figures
        _progress("dispatch_flow_memory")

        for name, size in sizes.items():
            table.add("stored bytes, 1 pending entry", name, size, size / sizes["plain"], "")
        table.figures["stored_bytes"] = sizes
        table.notes.append(
            "Per message: one state (~1 KB of JSON) and one entry payload (~600 bytes) "
            "encoded on commit; one entry decoded per publish. AES-256-GCM via cryptography; "
            "zlib level 6. The stored-bytes rows give bytes and the ratio to plain."
        )
    finally:
        client.close()
    return table
