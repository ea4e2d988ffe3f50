"""Drive an async store from synchronous test code, so one contract suite covers both."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterable, Callable
from typing import Any


class BlockingStore:
    """Every coroutine method of the wrapped store runs to completion on ``loop``."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if inspect.iscoroutinefunction(attr):
            return self._blocking(attr)
        if inspect.isasyncgenfunction(attr):
            return self._collecting(attr)
        if inspect.ismethod(attr):
            return self._iterating(attr)
        return attr

    def blocking(self, port: Any) -> BlockingStore:
        """``port`` (the wrapped store's async backend, say) driven on the same loop."""
        return BlockingStore(port, self._loop)

    def _iterating(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A method that returns an async iterator (after checking its arguments)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            if not isinstance(result, AsyncIterable):
                return result

            async def collect() -> list[Any]:
                return [item async for item in result]

            return iter(self._loop.run_until_complete(collect()))

        return call

    def _blocking(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(fn(*args, **kwargs))

        return call

    def _collecting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        async def collect(*args: Any, **kwargs: Any) -> list[Any]:
            return [item async for item in fn(*args, **kwargs)]

        def call(*args: Any, **kwargs: Any) -> Any:
            return iter(self._loop.run_until_complete(collect(*args, **kwargs)))

        return call
