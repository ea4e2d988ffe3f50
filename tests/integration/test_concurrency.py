"""Many writers on one aggregate, with a dispatcher-like trimmer, on the wire server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from docoutbox import AggregateStore, Outcome, RetryPolicy, StoreConfig
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox_mongo import MongoBackend

pytestmark = pytest.mark.wire

THREADS = 8
PER_THREAD = 200
PATIENT = StoreConfig(retry=RetryPolicy(max_attempts=100_000, base_delay=0.0005, max_delay=0.02))


@pytest.fixture
def collection(mongo_uri: str) -> Iterator[Any]:
    client: MongoClient[Any] = MongoClient(mongo_uri, maxPoolSize=THREADS * 2 + 4)
    coll = client["docoutbox_test"][f"concurrency_{threading.get_ident()}"]
    coll.drop()
    yield coll
    coll.drop()
    client.close()


class Trimmer(threading.Thread):
    """Publishes (records) whatever is pending and trims it, until told to stop."""

    def __init__(self, store: AggregateStore[Counter]) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.published: dict[str, int] = {}
        self.trims = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.drain()
            self.drain()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def drain(self) -> None:
        snapshot = self.store.get("hot")
        batch = [(e.id, e.seq) for e in snapshot.outbox]
        if batch:
            self.published.update(batch)
            assert self.store.trim("hot", [entry_id for entry_id, _ in batch])
            self.trims += 1


def run_writers(store_for: Any, threads: int, per_thread: int) -> list[Outcome[Counter]]:
    outcomes: list[Outcome[Counter]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        store = store_for()
        try:
            for i in range(per_thread):
                outcome = store.handle("hot", add_msg(f"w{worker}-{i}"), counter_handlers)
                with lock:
                    outcomes.append(outcome)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    return outcomes


def test_eight_writers_and_a_trimmer_on_one_aggregate(collection: Any) -> None:
    def store_for() -> AggregateStore[Counter]:
        return AggregateStore(MongoBackend(collection), Counter, PATIENT)

    store_for().create("hot", Counter())
    trimmer = Trimmer(store_for())
    trimmer.start()
    outcomes = run_writers(store_for, THREADS, PER_THREAD)
    trimmer.stop.set()
    trimmer.join()
    assert trimmer.error is None, trimmer.error

    total = THREADS * PER_THREAD
    assert all(o.applied for o in outcomes)
    assert sorted(o.version for o in outcomes) == list(range(1, total + 1))
    final = store_for().get("hot")
    assert final.version == total
    assert final.outbox_seq == total
    assert final.state.total == total
    emitted = {e.id: e.seq for o in outcomes for e in o.emitted}
    assert sorted(emitted.values()) == list(range(1, total + 1))
    # Every emitted entry was either published-then-trimmed or is still pending.
    remaining = {e.id: e.seq for e in final.outbox}
    assert {**trimmer.published, **remaining} == emitted
    assert trimmer.trims > 0


def test_trims_never_fail_a_single_writers_commit(collection: Any) -> None:
    store = AggregateStore(MongoBackend(collection), Counter, PATIENT)
    store.create("hot", Counter())
    trimmer = Trimmer(AggregateStore(MongoBackend(collection), Counter))
    trimmer.start()
    outcomes = [store.handle("hot", add_msg(f"m{i}"), counter_handlers) for i in range(300)]
    trimmer.stop.set()
    trimmer.join()
    assert trimmer.error is None, trimmer.error
    assert trimmer.trims > 0
    assert [o.attempts for o in outcomes] == [1] * 300  # not one conflict
    assert store.get("hot").version == 300
