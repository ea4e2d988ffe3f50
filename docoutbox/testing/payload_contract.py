"""The payload store contract (:mod:`docoutbox.ports.payloads`), for every adapter.

Subclass :class:`PayloadStoreContract` and provide a ``payloads`` fixture returning a
sync payload store (an async one behind a blocking wrapper) on fresh storage.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docoutbox.errors import PayloadMissing
from docoutbox.ports.payloads import PayloadInfo

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def info(
    payload_id: str, data: bytes, at: datetime = T0, generation: str = "g1", aggregate: Any = "a"
) -> PayloadInfo:
    return PayloadInfo(payload_id, aggregate, f"e-{payload_id}", len(data), at, generation)


class PayloadStoreContract:
    """What every payload store must do."""

    #: Bytes over several chunks of every adapter's default chunk size.
    LARGE = 3 * 1024 * 1024 + 17

    def test_a_put_reads_back_whole(self, payloads: Any) -> None:
        data = bytes(range(256)) * (self.LARGE // 256) + b"tail"
        payloads.put(info("p1", data), data)
        assert payloads.get("p1") == data
        payloads.put(info("p2", b""), b"")
        assert payloads.get("p2") == b""

    def test_a_missing_payload_is_a_typed_error(self, payloads: Any) -> None:
        with pytest.raises(PayloadMissing):
            payloads.get("nope")

    def test_a_put_again_replaces_the_payload(self, payloads: Any) -> None:
        payloads.put(info("p", b"abc"), b"abc")
        payloads.put(info("p", b"abc", T0 + timedelta(seconds=5), "g2"), b"abc")
        assert payloads.get("p") == b"abc"
        (listed,) = payloads.stale(T0 + timedelta(days=1), 10)
        assert listed.generation == "g2" and listed.stored_at == T0 + timedelta(seconds=5)

    def test_delete_removes_and_ignores_unknown_ids(self, payloads: Any) -> None:
        payloads.put(info("p", b"abc"), b"abc")
        payloads.delete(["p", "unknown"])
        with pytest.raises(PayloadMissing):
            payloads.get("p")

    def test_stale_lists_old_puts_oldest_first(self, payloads: Any) -> None:
        for n in (3, 1, 2, 9):
            payloads.put(info(f"p{n}", b"x", T0 + timedelta(seconds=n)), b"x")
        listed = payloads.stale(T0 + timedelta(seconds=5), 2)
        assert [i.payload_id for i in listed] == ["p1", "p2"]
        assert listed[0] == info("p1", b"x", T0 + timedelta(seconds=1))

    def test_delete_stale_removes_only_the_put_it_was_shown(self, payloads: Any) -> None:
        payloads.put(info("p", b"abc"), b"abc")
        (old,) = payloads.stale(T0 + timedelta(seconds=1), 10)
        payloads.put(info("p", b"abc", T0 + timedelta(seconds=9), "g2"), b"abc")
        assert not payloads.delete_stale(old)
        assert payloads.get("p") == b"abc"
        (new,) = payloads.stale(T0 + timedelta(seconds=10), 10)
        assert payloads.delete_stale(new)
        assert not payloads.delete_stale(new)
        with pytest.raises(PayloadMissing):
            payloads.get("p")

    def test_an_integer_aggregate_id_is_kept(self, payloads: Any) -> None:
        payloads.put(info("p", b"abc", aggregate=42), b"abc")
        (listed,) = payloads.stale(T0 + timedelta(seconds=1), 10)
        assert listed.aggregate_id == 42
