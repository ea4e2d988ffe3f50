"""A producer collection, a consumer collection and dead letters with planted anomalies,
and the exact findings an audit must report for them (no more, no fewer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

NOW = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)
SLA = 300.0
WINDOW = 100
ABOVE_LIMIT = 100
PARTITIONS = 8
BIG = 14_500_000  # bytes of state: above 80% of 16 MiB, below the limit
OK = 6  # clean producers


def _at(seconds_ago: float) -> datetime:
    return (NOW - timedelta(seconds=seconds_ago)).replace(tzinfo=None)


def entry(
    agg: str, seq: int, *, id: str | None = None, age: float = 10.0, **extra: Any
) -> dict[str, Any]:
    return {
        "id": id or f"{agg}-e{seq}",
        "type": extra.pop("type", "Credited"),
        "payload": {"amount": seq},
        "headers": {"traceparent": "00-abc-def-01"},
        "created_at": _at(age),
        "seq": seq,
        "aggregate_id": agg,
        "aggregate_type": "Wallet",
        "correlation_id": None,
        "causation_id": f"cmd-{agg}-{seq}",
        "destination": extra.pop("destination", "statements"),
        **extra,
    }


def doc(
    agg: str, outbox_seq: int, outbox: list[dict[str, Any]], partition: int, **extra: Any
) -> dict[str, Any]:
    return {
        "_id": agg,
        "type": extra.pop("type", "Wallet"),
        "version": outbox_seq + 1,
        "partition": partition,
        "state": extra.pop("state", {"balance": 10}),
        "inbox": extra.pop("inbox", [f"cmd-{agg}-1"]),
        "inbox_marks": extra.pop("inbox_marks", []),
        "outbox": outbox,
        "outbox_seq": outbox_seq,
        "created_at": _at(7200),
        "updated_at": _at(5),
        **extra,
    }


def mark(source: str, hw: int, above: list[int] | None = None) -> dict[str, Any]:
    return {"source": source, "hw": hw, "above": above or []}


def producer(big: bool = True) -> list[dict[str, Any]]:
    docs = [doc(f"w-ok-{i}", 3, [entry(f"w-ok-{i}", 3)], i % 7) for i in range(OK)]
    docs += [
        doc("w-stuck", 1, [entry("w-stuck", 1, age=3600)], 1),
        doc("w-retry", 1, [entry("w-retry", 1, attempts=3, last_error="broker refused")], 2),
        doc("w-gap", 6, [entry("w-gap", 4), entry("w-gap", 6)], 3),
        doc("w-dup-seq", 2, [entry("w-dup-seq", 2, id="d1"), entry("w-dup-seq", 2, id="d2")], 4),
        doc("w-behind", 1, [entry("w-behind", 2)], 5),
        doc("w-dupid-a", 1, [entry("w-dupid-a", 1, id="shared-id")], 6),
        doc("w-dupid-b", 1, [entry("w-dupid-b", 1, id="shared-id")], 0),
        doc("w-lost", 5, [], 1),
        doc("w-duplicated", 2, [], 2),
        doc("w-unexpected", 1, [], 3),
        doc("w-dead", 2, [], 4),
        doc("w-window", 0, [], 5, inbox=[f"m{i}" for i in range(WINDOW)]),
        doc(
            "w-above",
            0,
            [],
            6,
            inbox_marks=[mark("Other/x", 0, list(range(2, 2 + 2 * ABOVE_LIMIT, 2)))],
        ),
        doc("w-skew", 30, [entry("w-skew", s) for s in range(1, 31)], 7),
        # malformed
        doc("m-version", 0, [], 0, version="abc"),
        doc("m-outbox", 0, "oops", 1),  # type: ignore[arg-type]
        doc("m-outbox-obj", 0, {"a": 1}, 2),  # type: ignore[arg-type]
        {"_id": "m-missing", "version": 1, "outbox": []},
        doc(
            "m-entry",
            0,
            [
                {
                    "id": "e-bad",
                    "type": "Credited",
                    "seq": "x",
                    "created_at": _at(10),
                    "aggregate_id": "m-entry",
                    "aggregate_type": "Wallet",
                }
            ],
            3,
        ),
    ]
    if big:
        docs.append(doc("w-big", 0, [], 4, state={"blob": "x" * BIG}))
    return docs


def consumer() -> list[dict[str, Any]]:
    def c(agg: str, *marks: dict[str, Any], inbox: list[str] | None = None) -> dict[str, Any]:
        return doc(
            f"c-{agg}", 0, [], 0, type="Statement", inbox=inbox or [], inbox_marks=list(marks)
        )

    docs = [
        c(f"w-ok-{i}", mark(f"Wallet/w-ok-{i}", 2), inbox=["m-dup"] if i == 0 else None)
        for i in range(OK)
    ]
    docs += [
        c("w-gap", mark("Wallet/w-gap", 3, [5])),
        c("w-dup-seq", mark("Wallet/w-dup-seq", 1)),
        c("w-behind", mark("Wallet/w-behind", 1)),
        c("w-lost", mark("Wallet/w-lost", 3)),
        c("w-duplicated", mark("Wallet/w-duplicated", 2)),
        c("extra", mark("Wallet/w-duplicated", 0, [2]), inbox=["m-dup"]),
        c("w-unexpected", mark("Wallet/w-unexpected", 3)),
        c("w-dead", mark("Wallet/w-dead", 1)),
        c("w-skew", mark("Wallet/w-skew", 0)),
        # A consumer whose ID window is full and whose exact-mode marks of a source keep
        # growing: saturation on the consumer side.
        c(
            "sat",
            mark("Other/y", 0, list(range(2, 2 + 2 * ABOVE_LIMIT, 2))),
            inbox=[f"c-m{i}" for i in range(WINDOW)],
        ),
    ]
    return docs


def dead_letters() -> list[dict[str, Any]]:
    return [
        {
            "_id": "w-dead-e2",
            "aggregate_id": "w-dead",
            "entry": entry("w-dead", 2),
            "error": "poison: bad payload",
            "attempts": 5,
            "quarantined_at": _at(60),
        },
        {
            "_id": "w-x/malformed/abc",
            "aggregate_id": "w-x",
            "entry": {"garbage": True},
            "error": "malformed entry",
            "attempts": 0,
            "quarantined_at": _at(30),
        },
    ]


# kind -> the keys an audit must report (see key()).
EXPECTED: dict[str, set[Any]] = {
    "malformed": {
        ("m-version", None),
        ("m-outbox", None),
        ("m-outbox-obj", None),
        ("m-missing", None),
        ("m-entry", "e-bad"),
    },
    "unread_documents": set(),
    "stuck": {("w-stuck", "w-stuck-e1")},
    "retrying": {("w-retry", "w-retry-e1")},
    "seq_gap": {("w-gap", 5)},
    "seq_duplicate": {("w-dup-seq", 2)},
    "outbox_seq_behind": {"w-behind"},
    "duplicate_entry_id": {"shared-id"},
    "inbox_window_full": {"w-window", "c-sat"},
    "inbox_above": {("w-above", "Other/x"), ("c-sat", "Other/y")},
    "near_size_limit": {"w-big"},
    "partition_skew": {7},
    "lost": {("Wallet/w-lost", 4), ("Wallet/w-lost", 5)},
    "duplicated": {("Wallet/w-duplicated", 2), "m-dup"},
    "unexpected": {("Wallet/w-unexpected", 2), ("Wallet/w-unexpected", 3)},
    "dead_letter": {"w-dead-e2", "w-x/malformed/abc"},
    "unverifiable": set(),
}


def key(kind: str, row: dict[str, Any]) -> Any:
    if kind in ("malformed", "stuck", "retrying"):
        return (row["aggregate_id"], row["entry_id"])
    if kind in ("seq_gap", "seq_duplicate"):
        return (row["aggregate_id"], row["seq"])
    if kind in ("outbox_seq_behind", "inbox_window_full", "near_size_limit"):
        return row["aggregate_id"]
    if kind == "duplicate_entry_id":
        return row["entry_id"]
    if kind == "inbox_above":
        return (row["aggregate_id"], row["source"])
    if kind == "partition_skew":
        return row["partition"]
    if kind in ("lost", "unexpected", "unverifiable"):
        return (row["source"], row["seq"])
    if kind == "duplicated":
        return (row["source"], row["seq"]) if "source" in row else row["entry_id"]
    if kind == "dead_letter":
        return row["id"]
    if kind == "unread_documents":
        return row["missing"]
    raise KeyError(kind)


def reported(summary: dict[str, Any]) -> dict[str, set[Any]]:
    return {kind: {key(kind, r) for r in summary["rows"].get(kind, [])} for kind in EXPECTED}
