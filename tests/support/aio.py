"""Drive an async publisher or consumer from synchronous test code, so one suite tests both."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Self

from docoutbox.testing.blocking import BlockingStore


class Blocking(BlockingStore):
    """Every coroutine method of ``target`` runs to completion on a private event loop;
    attributes set on the wrapper are set on ``target``."""

    def __init__(self, target: Any) -> None:
        super().__init__(target, asyncio.new_event_loop())

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._store, name, value)

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._store.close())
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
