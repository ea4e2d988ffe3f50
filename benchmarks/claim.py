"""Benchmark: the cost per message of the claim check, as a ratio against the plain path.

Two stores on the wire server differ only in ``StoreConfig.claim_check`` (none, or
``ClaimCheck(MongoPayloads(...), threshold=64 KiB)`` over a side collection). One
message is the whole life of one entry: ``store.handle`` (one commit; with the claim
check, the payload's put before it), then the dispatch flow of the aggregate
(:func:`~docoutbox.dispatch.engine.flow.dispatch_document`, its operations performed
on the same collection and payload store: with the claim check, the payload's read
before the publish and its delete after the trim), publishing to a list. Payloads:

- 1 KB, under the threshold: what turning the claim check on costs a message it does
  not move;
- 256 KB, over it: the document carries a reference instead of the payload, at the
  price of a put, a read and a delete in the payload store (4 chunk documents of at most
  1 MiB each: one here).

A further row gives the size of the aggregate's document with the entry pending.
"""

from __future__ import annotations

import base64
import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import bson

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
from docoutbox.stored.claim import ClaimCheck, DeletePayloads, GetPayload, perform_payload
from docoutbox.stored.sweep import DeadLettered
from docoutbox_mongo import MongoBackend
from docoutbox_mongo.payloads import MongoPayloads

THRESHOLD = 64 * 1024
SIZES = {"1 KB": 1024, "256 KB": 256 * 1024}


class Sender(Aggregate):
    sent: int = 0


def _payload(size: int) -> str:
    raw = random.Random(size).randbytes(size * 3 // 4)
    return base64.b64encode(raw).decode("ascii")[:size]


def _handler(data: str) -> Callable[[Sender, Message], Decision[Sender]]:
    def send(state: Sender, message: Message) -> Decision[Sender]:
        return Decision(Sender(sent=state.sent + 1), emit("Sent", {"data": data}))

    return send


def _dispatch(backend: MongoBackend, payloads: MongoPayloads, aggregate: str) -> int:
    """Publish and trim the aggregate's pending entries; how many were published."""
    doc = backend.load(aggregate)
    assert doc is not None
    flow = dispatch_document(doc, DispatchPolicy(), random.Random(1))
    published = 0
    send: Any = None
    while True:
        try:
            op = flow.send(send)
        except StopIteration:
            return published
        send = None
        if isinstance(op, Publish):
            published += 1
        elif isinstance(op, Write):
            send = backend.write(op.plan)
        elif isinstance(op, GetPayload | DeletePayloads):
            send = perform_payload(op, payloads)
        elif isinstance(op, DeadLettered):
            send = False  # nothing is quarantined here
        else:
            raise AssertionError(f"unexpected operation {op!r}")


def _round(
    store: AggregateStore[Sender],
    backend: MongoBackend,
    payloads: MongoPayloads,
    ids: list[str],
    count: int,
    data: str,
) -> Callable[[], float]:
    serial = itertools.count()
    handler = _handler(data)

    def round_() -> float:
        start = time.perf_counter()
        for n in range(count):
            aggregate = ids[n % len(ids)]
            store.handle(aggregate, {"id": f"m-{next(serial)}", "type": "Send"}, handler)
            assert _dispatch(backend, payloads, aggregate) == 1
        return count / (time.perf_counter() - start)

    return round_


def run(uri: str, scale: Scale) -> Table:
    table = Table(
        "claim",
        "The claim check vs the plain path, per message (handle + publish + trim; ratio of "
        "throughputs; 1.00 = no cost)",
        ["payload", "path", "messages/s", "vs plain", "IQR"],
    )
    ids = [f"s-{i}" for i in range(max(2, scale.aggregates // 4))]
    count = max(4, scale.messages // 3)
    client = connect(uri)
    loads = [os.getloadavg()[0]]
    try:
        for label, size in SIZES.items():
            data = _payload(size)
            rounds = {}
            sizes = {}
            for path in ("plain", "claim"):
                coll = new_collection(client, f"claim_{path}")
                side = MongoPayloads(coll.database[f"{coll.name}_payloads"])
                backend = MongoBackend(coll)
                config = StoreConfig(
                    claim_check=ClaimCheck(side, threshold=THRESHOLD) if path == "claim" else None
                )
                store = AggregateStore(backend, Sender, config)
                for aggregate in ids:
                    store.create(aggregate, Sender())
                store.handle(ids[0], {"id": "probe", "type": "Send"}, _handler(data))
                sizes[path] = len(bson.encode(coll.find_one({"_id": ids[0]})))
                _dispatch(backend, side, ids[0])
                rounds[path] = _round(store, backend, side, ids, count, data)
            samples = interleaved(rounds, scale.rounds, scale.warmup)
            for path, values in samples.items():
                ratio = paired_ratio(values, samples["plain"])
                low, high = ratio_range(values, samples["plain"])
                table.add(label, path, median(values), ratio, f"{low:.2f}-{high:.2f}")
                table.figures[f"{label} {path}"] = {
                    "rate": median(values),
                    "ratio": ratio,
                    "iqr": [low, high],
                    "document_bytes": sizes[path],
                }
            for path in ("plain", "claim"):
                table.add(f"{label}, document bytes pending", path, sizes[path], "", "")
            print(f"[bench] claim: {label} measured", file=sys.stderr, flush=True)
        loads.append(os.getloadavg()[0])
        table.figures["load_average"] = loads
        table.notes.append(
            f"Load average (1 min) {min(loads):.1f}-{max(loads):.1f} on "
            f"{os.cpu_count()} cores. Threshold {THRESHOLD // 1024} KiB; payloads of base64 "
            "text that does not compress; one entry per message, dispatched (read, "
            "published to a list, trimmed, payload deleted) before the next message. "
            "Wire server."
        )
    finally:
        client.close()
    return table
