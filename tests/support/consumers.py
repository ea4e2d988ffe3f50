"""Doubles for the consumer shells' unit tests: a polled Kafka record, a count of the
receivers a consumer module builds, and a handler that refuses every message."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.ledger import Ledger
from docoutbox import Message


class Record:
    """A polled record of topic ``t``, partition 0."""

    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def error(self) -> None:
        return None


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the receivers ``module`` builds."""
    built: list[int] = []
    original = getattr(module, name)

    def made(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, made)
    return built


def refusing(state: Ledger, message: Message) -> Ledger:
    raise RuntimeError(f"refused {message.id}")
