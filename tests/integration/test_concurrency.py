"""Many writers on one aggregate, with a dispatcher-like trimmer, on every database backend
(the MongoDB wire server and the session's Cosmos DB account)."""

from __future__ import annotations

from docoutbox import AggregateStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from tests.support.backends import PATIENT, PER_THREAD, THREADS, Bundle, Trimmer, run_writers

#: Messages of the single writer: fewer on Cosmos DB, whose local server is slower.
SINGLE_WRITER = {"mongo": 300, "cosmos": 150}


def test_eight_writers_and_a_trimmer_on_one_aggregate(bundle: Bundle) -> None:
    def store_for() -> AggregateStore[Counter]:
        return AggregateStore(bundle.store_backend(), Counter, PATIENT)

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
    assert (final.version, final.outbox_seq, final.state.total) == (total, total, total)
    emitted = {e.id: e.seq for o in outcomes for e in o.emitted}
    assert sorted(emitted.values()) == list(range(1, total + 1))
    # Every emitted entry was either published-then-trimmed or is still pending: nothing
    # lost, nothing revived.
    remaining = {e.id: e.seq for e in final.outbox}
    assert {**trimmer.published, **remaining} == emitted
    assert trimmer.trims > 0
    if bundle.kind == "cosmos":  # the request charge of every request is reported
        assert bundle.charges and all(kind and status for kind, status, _ in bundle.charges)


def test_trims_never_fail_a_single_writers_commit(bundle: Bundle) -> None:
    count = SINGLE_WRITER[bundle.kind]
    store = AggregateStore(bundle.store_backend(), Counter, PATIENT)
    store.create("hot", Counter())
    trimmer = Trimmer(AggregateStore(bundle.store_backend(), Counter))
    trimmer.start()
    outcomes = [store.handle("hot", add_msg(f"m{i}"), counter_handlers) for i in range(count)]
    trimmer.stop.set()
    trimmer.join()
    assert trimmer.error is None, trimmer.error
    assert trimmer.trims > 0
    assert [o.attempts for o in outcomes] == [1] * count  # not one conflict
    assert store.get("hot").version == count
