"""Group commit: concurrent handle calls on one aggregate share writes instead of racing."""

from __future__ import annotations

import pytest

from docoutbox import (
    AggregateStore,
    NotFound,
)
from docoutbox.testing import MemoryBackend
from docoutbox.testing.contract import Counter, add_msg, counter_handlers


def test_missing_aggregate_raises_not_found_in_group_mode() -> None:

    store = AggregateStore(MemoryBackend(), Counter, group_commit=True)
    with pytest.raises(NotFound):
        store.handle("nobody", add_msg("m1"), counter_handlers)
    assert store.handle("nobody", add_msg("m1"), counter_handlers, create=True).applied


def test_redelivery_in_group_mode_is_a_duplicate() -> None:
    store = AggregateStore(MemoryBackend(), Counter, group_commit=True)
    store.handle("a", add_msg("m1"), counter_handlers, create=True)
    assert store.handle("a", add_msg("m1"), counter_handlers).duplicate
