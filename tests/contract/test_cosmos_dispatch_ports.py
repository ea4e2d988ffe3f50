"""The dispatch-port contracts on Cosmos DB, sync (``azure.cosmos``) and aio
(``azure.cosmos.aio``, driven through :class:`~docoutbox.testing.blocking.BlockingStore`):
change source, checkpoints, lease table and dead letters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from docoutbox import AggregateStore
from docoutbox.testing.blocking import BlockingStore
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch_contract import (
    ChangeSourceContract,
    CheckpointsContract,
    DeadLettersContract,
    LeaseTableContract,
    _events_until,
    _with_docs,
)
from tests.support.cosmos import async_container, create_container, scratch_database, unique
from tests.support.servers import CosmosAccount

pytestmark = pytest.mark.cosmos


class Ports:
    """Fresh containers of one database, as sync proxies or as aio ones on ``loop``."""

    def __init__(self, account: CosmosAccount, database: Any, flavour: str) -> None:
        self.account = account
        self.database = database
        self.flavour = flavour
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closers: list[Any] = []

    def container(self) -> tuple[Any, Any]:
        """(sync proxy, the proxy of the flavour) of a new container."""
        sync = create_container(self.database, unique("c"))
        if self.flavour == "sync":
            return sync, sync
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        proxy, close = async_container(self.account, self.database.id, sync.id, self.loop)
        self._closers.append(close)
        return sync, proxy

    def port(self, port: Any) -> Any:
        return port if self.loop is None else BlockingStore(port, self.loop)

    def close(self) -> None:
        for close in self._closers:
            close()
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(scope="module")
def database(cosmos_server: CosmosAccount) -> Iterator[Any]:
    with scratch_database(cosmos_server) as db:
        yield db


@pytest.fixture(params=["sync", "aio"])
def ports(
    request: pytest.FixtureRequest, cosmos_server: CosmosAccount, database: Any
) -> Iterator[Ports]:
    made = Ports(cosmos_server, database, request.param)
    yield made
    made.close()


class TestCosmosChangeSource(ChangeSourceContract):
    @pytest.fixture
    def change_source(self, ports: Ports) -> tuple[Any, Any]:
        from docoutbox_cosmos import AsyncCosmosChangeSource, CosmosBackend, CosmosChangeSource

        sync, proxy = ports.container()
        kind = CosmosChangeSource if ports.flavour == "sync" else AsyncCosmosChangeSource
        return ports.port(kind(proxy)), CosmosBackend(sync)

    def test_changes_after_the_start_marker_arrive_in_commit_order(
        self, change_source: tuple[Any, Any]
    ) -> None:
        """Cosmos DB's latest-version feed is ordered per feed range only and shows an
        item's latest version: every aggregate arrives, at its last version."""
        source, backend = change_source
        store = AggregateStore(backend, Counter)
        source.open(source.start_marker())
        try:
            for n in (1, 2):
                for i in range(3):
                    store.handle(f"a{i}", add_msg(f"m{i}-{n}"), counter_handlers, create=True)
            events = _events_until(
                source,
                lambda seen: (
                    {e.document["_id"]: e.document["version"] for e in seen if e.document}
                    == {f"a{i}": 2 for i in range(3)}
                ),
            )
            assert all(e.document["outbox"][0]["seq"] == 1 for e in events if e.document)
        finally:
            source.close()

    def test_a_position_resumes_right_after_its_event(self, change_source: tuple[Any, Any]) -> None:
        """A continuation exists per page only: resuming from an event inside a page reads
        that page again (publishing is at least once), and never skips what follows."""
        source, backend = change_source
        store = AggregateStore(backend, Counter)
        source.open(source.start_marker())
        try:
            store.handle("a", add_msg("m1"), counter_handlers, create=True)
            store.handle("b", add_msg("m2"), counter_handlers, create=True)
            events = _events_until(source, lambda seen: {"a", "b"} <= set(_with_docs(seen)))
            last = events[-1]
            source.open(events[0].position)
            rest = set(_with_docs(events[1:]))
            again = _events_until(source, lambda seen: rest <= set(_with_docs(seen)))
            assert again[-1].position == last.position
            source.open(last.position)  # after the last event: nothing more
            store.handle("c", add_msg("m3"), counter_handlers, create=True)
            assert _with_docs(_events_until(source, lambda seen: bool(_with_docs(seen)))) == ["c"]
        finally:
            source.close()


class TestCosmosCheckpoints(CheckpointsContract):
    @pytest.fixture
    def checkpoints(self, ports: Ports) -> Any:
        from docoutbox_cosmos import AsyncCosmosCheckpoints, CosmosCheckpoints

        _, proxy = ports.container()
        kind = CosmosCheckpoints if ports.flavour == "sync" else AsyncCosmosCheckpoints
        return ports.port(kind(proxy))


class TestCosmosLeaseTable(LeaseTableContract):
    @pytest.fixture
    def lease_table(self, database: Any) -> Any:
        from docoutbox_cosmos import CosmosLeaseTable  # sync only: leases heartbeat on a thread

        return CosmosLeaseTable(create_container(database, unique("leases")), "group")


class TestCosmosDeadLetters(DeadLettersContract):
    @pytest.fixture
    def dead_letters(self, ports: Ports) -> tuple[Any, Any]:
        from docoutbox_cosmos import AsyncCosmosDeadLetters, CosmosDeadLetters

        sync, proxy = ports.container()
        kind = CosmosDeadLetters if ports.flavour == "sync" else AsyncCosmosDeadLetters

        def count() -> int:
            query = sync.query_items(
                "SELECT VALUE COUNT(1) FROM c", enable_cross_partition_query=True
            )
            return int(sum(query))

        return ports.port(kind(proxy)), count
