"""The change source lets go of a page's raw items once their documents are made: the
SDK's pager keeps the page alive until the cyclic garbage collector frees it, so items it
still held would outlive the dispatcher's use of their documents (memory would follow the
backlog between collections, not what is in hand)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.changes import AsyncCosmosChangeSource, CosmosChangeSource
from tests.support import loopless

RANGE = {"Range": {"min": "", "max": "FF", "isMinInclusive": True, "isMaxInclusive": False}}


def raw_item(n: int) -> dict[str, Any]:
    return {
        "id": f"a{n}",
        "aid": f"a{n}",
        "type": "Counter",
        "version": 1,
        "outbox": [{"id": f"e{n}", "seq": 1, "created_at": "2030-01-01T00:00:00.000000Z"}],
        "outbox_seq": 1,
        "_etag": f"tag{n}",
    }


class Pager:
    """Like azure-cosmos's pager: it keeps the page it handed out."""

    def __init__(self, items: list[dict[str, Any]], hook: Any) -> None:
        self.current_page = items
        self.hook = hook

    def by_page(self) -> Iterator[Iterator[dict[str, Any]]]:
        self.hook({"etag": "next"}, self.current_page)
        yield iter(self.current_page)

    async def _pages(self) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        self.hook({"etag": "next"}, self.current_page)

        async def items() -> AsyncIterator[dict[str, Any]]:
            for item in self.current_page:
                yield item

        yield items()


class AsyncPager(Pager):
    def by_page(self) -> Any:
        return self._pages()


class Container:
    def __init__(self, pager: type[Pager]) -> None:
        self.pager_class = pager
        self.pagers: list[Pager] = []

    def query_items_change_feed(self, **kwargs: Any) -> Pager:
        pager = self.pager_class([raw_item(n) for n in range(3)], kwargs["response_hook"])
        self.pagers.append(pager)
        return pager


POSITION = {
    "v": 1,
    "ranges": {
        '{"Range":{"isMaxInclusive":false,"isMinInclusive":true,"max":"FF","min":""}}': "t0"
    },
}


def test_the_pagers_items_are_let_go_once_their_documents_are_made() -> None:
    container = Container(Pager)
    source = CosmosChangeSource(container, feed_ranges=[RANGE])
    source.open(POSITION)
    events = source.poll(10)
    assert [e.document["_id"] for e in events if e.document] == ["a0", "a1", "a2"]
    assert events[0].document is not None and events[0].document["outbox"][0]["id"] == "e0"
    assert all(item == {} for item in container.pagers[0].current_page)


def test_the_async_source_lets_go_of_them_too() -> None:
    container = Container(AsyncPager)
    source = AsyncCosmosChangeSource(container, feed_ranges=[RANGE])

    async def poll() -> list[Any]:
        await source.open(POSITION)
        return await source.poll(10)

    events = loopless.run(poll())
    assert [e.document["_id"] for e in events if e.document] == ["a0", "a1", "a2"]
    assert all(item == {} for item in container.pagers[0].current_page)


class QueryContainer:
    """A container whose query pager, like azure-cosmos's, keeps the page it handed out."""

    def __init__(self) -> None:
        self.pages: list[list[dict[str, Any]]] = []

    def query_items(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        page = [] if self.pages else [raw_item(n) for n in range(3)]
        self.pages.append(page)
        return iter(page)


def test_a_sweep_page_lets_go_of_its_items_too() -> None:
    container = QueryContainer()
    docs = CosmosBackend(container).find_pending(after=None, limit=10)
    assert [d["_id"] for d in docs] == ["a0", "a1", "a2"]
    assert docs[0]["outbox"][0]["id"] == "e0"
    assert container.pages and all(item == {} for page in container.pages for item in page)
