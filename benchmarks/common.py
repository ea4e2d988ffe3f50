"""Shared machinery: the server, counting clients, interleaved rounds, medians and tables."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bson
from pymongo import MongoClient, monitoring

from benchmarks.servers import MongoWireServer, mongo_wire_server_available

DATABASE = "docoutbox_bench"


@dataclass(frozen=True)
class Scale:
    """How much work each benchmark does. ``quick`` only proves the code runs."""

    messages: int = 300  # per variant and round
    rounds: int = 15
    warmup: int = 1
    aggregates: int = 20
    hot_segments: int = 6
    mem_docs: int = 100_000
    mem_entries_per_doc: int = 10
    dispatch_entries: int = 2_000
    lag_aggregates: int = 1_000_000
    lag_pending: int = 2_000

    @classmethod
    def quick(cls) -> Scale:
        return cls(
            messages=12,
            rounds=1,
            warmup=0,
            aggregates=3,
            hot_segments=2,
            mem_docs=100,
            mem_entries_per_doc=5,
            dispatch_entries=30,
            lag_aggregates=400,
            lag_pending=20,
        )


@contextlib.contextmanager
def mongo_server(*, java_heap: str | None = None) -> Iterator[str]:
    """``$MONGODB_URI`` if set, else a private wire server (optionally with a bigger heap)."""
    uri = os.environ.get("MONGODB_URI")
    if uri:
        yield uri
        return
    reason = mongo_wire_server_available()
    if reason is not None:
        raise SystemExit(f"cannot start the MongoDB wire server: {reason}")
    saved = os.environ.get("JAVA_TOOL_OPTIONS")
    if java_heap:
        os.environ["JAVA_TOOL_OPTIONS"] = f"-Xmx{java_heap}"
    try:
        server = MongoWireServer().start()
    finally:
        if saved is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = saved
    try:
        yield server.uri
    finally:
        server.stop()


def connect(uri: str, *listeners: monitoring.CommandListener) -> MongoClient[Any]:
    return MongoClient(uri, uuidRepresentation="standard", event_listeners=list(listeners))


def new_collection(client: MongoClient[Any], prefix: str) -> Any:
    """A fresh, empty collection with a unique name."""
    coll = client[DATABASE][f"{prefix}_{uuid.uuid4().hex[:8]}"]
    coll.drop()
    return coll


@dataclass
class Tally:
    """Commands seen while counting: how many, and the bytes sent and received."""

    commands: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    received: int = 0
    failed: int = 0

    @property
    def round_trips(self) -> int:
        return sum(self.commands.values())

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())


class CommandCounter(monitoring.CommandListener):
    """Counts the commands of one client, with ``len(bson.encode(...))`` of each.

    Inactive outside :meth:`counting`, so it costs nothing while throughput is timed
    (throughput rounds use a client without listeners anyway).
    """

    def __init__(self) -> None:
        self.tally = Tally()
        self.active = False

    @contextlib.contextmanager
    def counting(self) -> Iterator[Tally]:
        self.tally = Tally()
        self.active = True
        try:
            yield self.tally
        finally:
            self.active = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.active:
            self.tally.commands[event.command_name] += 1
            self.tally.sent[event.command_name] += len(bson.encode(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.active:
            self.tally.received += len(bson.encode(event.reply))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        if self.active:
            self.tally.failed += 1


Round = Callable[[], float]


def interleaved(variants: Mapping[str, Round], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Run every variant once per round, rotating the order; keep the post-warmup samples.

    Each variant returns its figure for one round (operations per second, usually).
    Rotating the order spreads slow phases of a shared machine over all variants, and
    pairing variants by round (see :func:`paired_ratio`) cancels the drift between rounds.
    """
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            value = variants[name]()
            if index >= warmup:
                samples[name].append(value)
    return samples


def timed_rate(count: int, work: Callable[[], object]) -> float:
    """Operations per second of ``work``, which performs ``count`` operations."""
    start = time.perf_counter()
    work()
    return count / (time.perf_counter() - start)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def cpu_medians(samples: Mapping[str, Sequence[float]], warmup: int) -> dict[str, float]:
    """Each variant's median client CPU per entry, past the ``warmup`` rounds (every
    variant of :func:`interleaved` records one sample per round, warm-ups first)."""
    return {name: median(values[warmup:] or values) for name, values in samples.items()}


def paired_ratio(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """The median over rounds of candidate/baseline measured in the same round."""
    return statistics.median(c / b for c, b in zip(candidate, baseline, strict=True))


def additive_bound(publish: Sequence[float], dispatch: Sequence[float]) -> float:
    """What a dispatcher can reach, as a share of its lower ceiling, if publishing and
    dispatching each keep their own rate but share one CPU (one interpreter, one GIL):
    the costs per entry add up, 1 / (1/publish + 1/dispatch), over min(publish,
    dispatch). 0.5 when the two ceilings are equal. The median over rounds."""
    return statistics.median(
        1 / (1 / p + 1 / d) / min(p, d) for p, d in zip(publish, dispatch, strict=True)
    )


def against_ceilings(
    candidate: Sequence[float], raw: Sequence[float], memory: Sequence[float] | None
) -> dict[str, Any]:
    """A broker dispatcher's rates, per round, against its two ceilings: the raw publish
    loop (``ratio_to_raw``, with its interquartile ``low``/``high``) and, when given, the
    same driver publishing to memory (``ratio_to_memory``); ``ratio_to_lower_ceiling``
    takes the lower of the two round by round, and ``additive_bound`` is
    :func:`additive_bound`. The ``memory`` figures are None without it."""
    low, high = ratio_range(candidate, raw)
    figures: dict[str, Any] = {
        "per_s": median(candidate),
        "ratio_to_raw": paired_ratio(candidate, raw),
        "low": low,
        "high": high,
        "ratio_to_memory": None,
        "ratio_to_lower_ceiling": None,
        "additive_bound": None,
    }
    if memory is not None:
        lower = [min(r, m) for r, m in zip(raw, memory, strict=True)]
        figures["ratio_to_memory"] = paired_ratio(candidate, memory)
        figures["ratio_to_lower_ceiling"] = paired_ratio(candidate, lower)
        figures["additive_bound"] = additive_bound(raw, memory)
    return figures


def ratio_range(candidate: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """The interquartile range of the per-round ratios (min and max below 4 rounds)."""
    ratios = sorted(c / b for c, b in zip(candidate, baseline, strict=True))
    if len(ratios) < 4:
        return ratios[0], ratios[-1]
    low, _, high = statistics.quantiles(ratios, n=4)
    return low, high


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


@dataclass
class Table:
    """One benchmark's result: rows of figures, with the notes needed to read them."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
            "figures": self.figures,
        }

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(fmt(cell) for cell in row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines)


def add_ceiling_rows(
    table: Table,
    samples: Mapping[int, Mapping[str, Sequence[float]]],
    cpu: Mapping[int, Mapping[str, float]],
    labels: Mapping[str, str],
    memory: Mapping[str, str],
    digits: int = 2,
) -> None:
    """Add to ``table`` one row per density and measured variant of a broker dispatch
    benchmark: its rate against the raw loop (``samples[density]["raw"]``) and against
    its two ceilings (:func:`against_ceilings`, ``memory`` naming each dispatcher's
    memory variant), then its client CPU per entry; the figures go to
    ``table.figures["per_aggregate_<density>"]``. ``digits``: of the ratio to the raw
    loop."""
    for density, by_kind in samples.items():
        figures: dict[str, Any] = {}
        for name, label in labels.items():
            if name not in by_kind:
                continue
            ceiling = memory.get(name)
            found = against_ceilings(
                by_kind[name], by_kind["raw"], by_kind[ceiling] if ceiling else None
            )
            low, high = found.pop("low"), found.pop("high")
            to_memory, lower = found["ratio_to_memory"], found["ratio_to_lower_ceiling"]
            bound = found["additive_bound"]
            table.add(
                density,
                label,
                found["per_s"],
                f"{found['ratio_to_raw']:.{digits}f}x ({low:.{digits}f}-{high:.{digits}f})",
                "" if to_memory is None else f"{to_memory:.2f}x",
                "" if lower is None else f"{lower:.2f}x",
                "" if bound is None else f"{bound:.2f}x",
                f"{cpu[density][name]:.0f}",
            )
            found["cpu_us_per_entry"] = cpu[density][name]
            figures[name] = found
        table.figures[f"per_aggregate_{density}"] = figures


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 100:
            return f"{value:.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
