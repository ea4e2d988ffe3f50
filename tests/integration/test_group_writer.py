"""Trims of concurrent runs go out together (group commit), in one ``bulk_write``.

Here: concurrent writers on threads and tasks, and the wire server; the pure parts are in
``tests/unit/test_group_writer.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from pymongo import MongoClient, monitoring

from docoutbox.dispatch.drivers.operations import AsyncGroupWriter, GroupWriter
from docoutbox.store.plans import WritePlan, plan_trim
from docoutbox_mongo import MongoBackend
from tests.unit.test_group_writer import stored, trims


class SlowBulk:
    """A backend whose ``write_many`` takes a while and records each batch's size."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
        self.batches.append(len(plans))
        time.sleep(0.05)
        return [True] * len(plans)


def test_concurrent_trims_share_round_trips() -> None:
    backend = SlowBulk()
    writer = GroupWriter(backend)
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(writer.write(plan_trim(f"a{i}", ["e"]))))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [True] * 8
    assert sum(backend.batches) == 8 and len(backend.batches) < 8
    assert (writer.plans, writer.batches) == (8, len(backend.batches))


def test_without_write_many_each_run_writes_its_own_trim_concurrently() -> None:
    """Queueing behind a leader would only serialize trims that cannot share a request
    (Cosmos DB): four writers must be in the backend at once."""

    class OnePerRequest:
        def __init__(self) -> None:
            self.barrier = threading.Barrier(4, timeout=5)

        def write(self, plan: WritePlan) -> bool:
            self.barrier.wait()  # BrokenBarrierError if the writes come one by one
            return True

    class AsyncOnePerRequest:
        def __init__(self) -> None:
            self.inside = 0
            self.most = 0

        async def write(self, plan: WritePlan) -> bool:
            self.inside += 1
            self.most = max(self.most, self.inside)
            await asyncio.sleep(0.01)
            self.inside -= 1
            return True

    writer = GroupWriter(OnePerRequest())
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(writer.write(plan_trim(f"a{i}", ["e"]))))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [True] * 4

    backend = AsyncOnePerRequest()
    awriter = AsyncGroupWriter(backend)

    async def main() -> list[bool]:
        return list(
            await asyncio.gather(*(awriter.write(plan_trim(f"a{i}", ["e"])) for i in range(4)))
        )

    assert asyncio.run(main()) == [True] * 4
    assert backend.most == 4


def test_async_trims_share_round_trips() -> None:
    class AsyncSlowBulk:
        def __init__(self) -> None:
            self.batches: list[int] = []

        async def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
            self.batches.append(len(plans))
            await asyncio.sleep(0.02)
            return [True] * len(plans)

    backend = AsyncSlowBulk()
    writer = AsyncGroupWriter(backend)

    async def main() -> list[bool]:
        return list(
            await asyncio.gather(*(writer.write(plan_trim(f"a{i}", ["e"])) for i in range(8)))
        )

    assert asyncio.run(main()) == [True] * 8
    assert sum(backend.batches) == 8 and len(backend.batches) < 8


@pytest.mark.wire
def test_many_trims_are_one_bulk_write_on_the_wire_server(mongo_uri: str) -> None:

    class Commands(monitoring.CommandListener):
        def __init__(self) -> None:
            self.names: list[str] = []

        def started(self, event: monitoring.CommandStartedEvent) -> None:
            self.names.append(event.command_name)

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            return None

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            return None

    commands = Commands()
    client: Any = MongoClient(mongo_uri, event_listeners=[commands])
    name = f"trims_{uuid.uuid4().hex[:8]}"
    try:
        backend = MongoBackend(client[name]["aggs"])
        ids = stored(backend, 4)
        commands.names.clear()
        assert backend.write_many(trims(ids)) == [True] * 4
        assert commands.names == ["update"]  # four $pulls, one round trip
        for aggregate, entries in ids.items():
            assert [e["id"] for e in backend.load(aggregate)["outbox"]] == entries[1:]
        missing = [*trims(ids), plan_trim("nobody", ["x"])]
        assert backend.write_many(missing) == [False] * 5  # the reply cannot say which
    finally:
        client.drop_database(name)
        client.close()


class GatedBulk:
    """A backend whose rounds each wait for their gate to open."""

    def __init__(self) -> None:
        self.gates = [threading.Event(), threading.Event()]
        self.batches: list[list[str]] = []

    def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
        self.batches.append([p.aggregate_id for p in plans])  # type: ignore[misc]
        assert self.gates[len(self.batches) - 1].wait(10)
        return [True] * len(plans)


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.001)


def test_a_writer_returns_after_its_own_round_not_after_the_next() -> None:
    """The next round is led by a writer that queued for it: the first leader's run does
    not wait behind later trims (else a busy dispatcher holds that run for ever)."""
    backend = GatedBulk()
    writer = GroupWriter(backend)
    done: dict[str, bool] = {}
    first = threading.Thread(
        target=lambda: done.setdefault("a", writer.write(plan_trim("a", ["e"])))
    )
    first.start()
    wait_for(lambda: backend.batches == [["a"]])
    second = threading.Thread(
        target=lambda: done.setdefault("b", writer.write(plan_trim("b", ["e"])))
    )
    second.start()
    wait_for(lambda: len(writer._queue) == 1)
    backend.gates[0].set()
    first.join(5)
    assert done == {"a": True}  # while the second round waits for its gate
    wait_for(lambda: backend.batches == [["a"], ["b"]])
    backend.gates[1].set()
    second.join(5)
    assert done == {"a": True, "b": True}
    assert (writer.batches, writer.plans) == (2, 2)


def test_an_async_writer_returns_after_its_own_round_not_after_the_next() -> None:
    class AsyncGatedBulk:
        def __init__(self) -> None:
            self.gates = [asyncio.Event(), asyncio.Event()]
            self.batches: list[list[str]] = []

        async def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
            self.batches.append([p.aggregate_id for p in plans])  # type: ignore[misc]
            await self.gates[len(self.batches) - 1].wait()
            return [True] * len(plans)

    async def main() -> None:
        backend = AsyncGatedBulk()
        writer = AsyncGroupWriter(backend)
        first = asyncio.create_task(writer.write(plan_trim("a", ["e"])))
        await asyncio.sleep(0)
        second = asyncio.create_task(writer.write(plan_trim("b", ["e"])))
        await asyncio.sleep(0)
        assert backend.batches == [["a"]]
        backend.gates[0].set()
        assert await asyncio.wait_for(first, 5) is True
        assert not second.done() and backend.batches == [["a"], ["b"]]
        backend.gates[1].set()
        assert await asyncio.wait_for(second, 5) is True

    asyncio.run(main())


def test_an_interrupted_round_fails_its_writers_and_hands_over() -> None:
    class Interrupted:
        def __init__(self) -> None:
            self.calls = 0

        async def write_many(self, plans: Sequence[WritePlan]) -> list[bool]:
            self.calls += 1
            if self.calls == 1:
                await asyncio.sleep(10)
            return [True] * len(plans)

    async def main() -> None:
        writer = AsyncGroupWriter(Interrupted())
        first = asyncio.create_task(writer.write(plan_trim("a", ["e"])))
        await asyncio.sleep(0)
        second = asyncio.create_task(writer.write(plan_trim("b", ["e"])))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, 5) is True  # led the next round

    asyncio.run(main())
