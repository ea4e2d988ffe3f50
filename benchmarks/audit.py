"""The Spark audit: time and memory of ``run_audit`` over the MongoDB Spark connector, over
the project's pymongo data source and over a Parquet snapshot, against a pymongo-only pass
that computes the same figures, and against a bare scan of the same sources (every row
and column read once and counted) in the same Spark session, at growing collection
sizes, in one run.

Run alone: ``python -m benchmarks.audit [--quick] [--sizes 25000 50000 100000]``; the
table is merged into ``benchmarks/results.json`` under ``benchmarks.audit``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bson import decode
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from benchmarks.common import Scale, Table, connect, mongo_server

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
SLA = 300.0
WINDOW = 100
LOST_EVERY = 5000  # one producer in this many has a lost seq (planted, cross-checked)
JARS = Path(__file__).resolve().parents[1] / "tests" / "servers" / "spark" / "lib"
MIB = 1024 * 1024


def _entry(agg: str, seq: int, age: float) -> dict[str, Any]:
    return {
        "id": f"{agg}-{seq}",
        "type": ("Credited", "Debited", "Opened")[seq % 3],
        "payload": {"amount": seq, "note": "x" * 40},
        "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        "created_at": (NOW - timedelta(seconds=age)).replace(tzinfo=None),
        "seq": seq,
        "aggregate_id": agg,
        "aggregate_type": "Wallet",
        "correlation_id": None,
        "causation_id": f"cmd-{agg}-{seq}",
        "destination": ("ledger", "statements")[seq % 2],
        "attempts": 1 if seq % 97 == 0 else 0,
    }


def documents(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Producer ``i`` (0-3 pending entries, a 20-ID inbox) and its consumer document with
    an exact-mode mark; every ``LOST_EVERY``-th producer lost its last seq."""
    agg = f"p-{i:08d}"
    outbox_seq = 5 + i % 20
    pending = i % 4
    lost = 1 if i % LOST_EVERY == 2 else 0
    seen = outbox_seq - pending - lost
    producer = {
        "_id": agg,
        "type": "Wallet",
        "version": outbox_seq,
        "partition": i % 16,
        "state": {"balance": i, "owner": f"owner-{i}"},
        "inbox": [f"cmd-{agg}-{k}" for k in range(20)],
        "inbox_marks": [],
        "outbox": [
            _entry(agg, s, age=(i % 600) + s)
            for s in range(outbox_seq - pending + 1, outbox_seq + 1)
        ],
        "outbox_seq": outbox_seq,
        "created_at": NOW.replace(tzinfo=None),
        "updated_at": NOW.replace(tzinfo=None),
    }
    consumer = {
        "_id": f"c-{i:08d}",
        "type": "Statement",
        "version": seen,
        "partition": i % 16,
        "state": {"lines": seen},
        "inbox": [],
        "inbox_marks": [{"source": f"Wallet/{agg}", "hw": seen, "above": []}],
        "outbox": [],
        "outbox_seq": 0,
    }
    return producer, consumer


def generate(db: Any, n: int, batch: int = 5000) -> None:
    """``n`` producer documents and their ``n`` consumer documents (:func:`documents`)."""
    producers, consumers = [], []
    for i in range(n):
        producer, consumer = documents(i)
        producers.append(producer)
        consumers.append(consumer)
        if len(producers) >= batch:
            db.producer.insert_many(producers)
            db.consumer.insert_many(consumers)
            producers, consumers = [], []
    if producers:
        db.producer.insert_many(producers)
        db.consumer.insert_many(consumers)


def generate_snapshot(directory: Path, n: int, batch: int = 50_000) -> None:
    """The documents of :func:`generate` written straight to a raw Parquet snapshot (the
    layout snapshots had before the typed one: raw rows with each document's exact BSON
    size, as the data source reads them), without a database. :func:`export_one` writes
    it again in the typed layout, as ``docoutbox export`` would."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from bson import encode

    from docoutbox_spark.datasource import _arrow_schema
    from docoutbox_spark.schema import RAW_DOCUMENT_SCHEMA, raw_row

    schema = _arrow_schema(RAW_DOCUMENT_SCHEMA)
    writers = {}
    for role in ("producer", "consumer"):
        (directory / role).mkdir(parents=True, exist_ok=True)
        writers[role] = pq.ParquetWriter(str(directory / role / "part-00000.parquet"), schema)
    try:
        for start in range(0, n, batch):
            rows: dict[str, list[tuple[Any, ...]]] = {"producer": [], "consumer": []}
            for i in range(start, min(n, start + batch)):
                for role, doc in zip(("producer", "consumer"), documents(i), strict=True):
                    rows[role].append(raw_row(doc, RAW_DOCUMENT_SCHEMA, size=len(encode(doc))))
            for role, found in rows.items():
                columns = list(zip(*found, strict=True))
                writers[role].write_batch(
                    pa.RecordBatch.from_arrays(
                        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
                        schema=schema,
                    )
                )
    finally:
        for writer in writers.values():
            writer.close()


def pymongo_pass(uri: str, database: str) -> dict[str, Any]:
    """The same figures as the Spark audit, in one Python pass per collection."""

    client: Any = MongoClient(uri, document_class=RawBSONDocument)
    db = client[database]
    backlog: Counter[tuple[str, str]] = Counter()
    ages: list[float] = []
    sizes: list[int] = []
    stuck = retrying = gaps = dups = behind = window_full = 0
    partitions: Counter[int] = Counter()
    entry_owners: dict[str, set[str]] = defaultdict(set)
    emitted: dict[str, int] = {}
    pending: set[tuple[str, int]] = set()
    now = NOW.replace(tzinfo=None)
    for raw in db.producer.find({}, batch_size=2000):
        sizes.append(len(raw.raw))
        doc = decode(raw.raw)
        agg = str(doc["_id"])
        outbox = doc.get("outbox") or []
        partitions[int(doc.get("partition", 0))] += len(outbox)
        seqs = []
        for e in outbox:
            backlog[(e.get("type"), e.get("destination") or "(default)")] += 1
            age = (now - e["created_at"]).total_seconds()
            ages.append(age)
            stuck += age > SLA
            retrying += e.get("attempts", 0) > 0
            seqs.append(e["seq"])
            entry_owners[e["id"]].add(agg)
            pending.add((f"{doc['type']}/{agg}", e["seq"]))
        if seqs:
            present = set(seqs)
            gaps += len(set(range(min(seqs), max(seqs) + 1)) - present)
            dups += sum(1 for v in Counter(seqs).values() if v > 1)
            behind += max(seqs) > doc["outbox_seq"]
        window_full += len(doc.get("inbox") or []) >= WINDOW
        emitted[f"{doc['type']}/{agg}"] = doc["outbox_seq"]
    seen: Counter[tuple[str, int]] = Counter()
    for raw in db.consumer.find({}, batch_size=2000):
        doc = decode(raw.raw)
        for m in doc.get("inbox_marks") or []:
            if m["source"] in emitted:
                for s in range(1, m["hw"] + 1):
                    seen[(m["source"], s)] += 1
                for s in m.get("above") or []:
                    seen[(m["source"], s)] += 1
    lost = sum(
        1
        for source, top in emitted.items()
        for s in range(1, top + 1)
        if (source, s) not in seen and (source, s) not in pending
    )
    duplicated = sum(1 for v in seen.values() if v > 1)
    ages.sort()
    sizes.sort()
    client.close()
    return {
        "documents": len(sizes),
        "pending": len(ages),
        "backlog": dict(backlog),
        "age_p99": ages[int(0.99 * (len(ages) - 1))] if ages else None,
        "size_p99": sizes[int(0.99 * (len(sizes) - 1))] if sizes else None,
        "headroom_mongodb_max": 1 - sizes[-1] / (16 * MIB) if sizes else None,
        "stuck": stuck,
        "retrying": retrying,
        "seq_gap": gaps,
        "seq_duplicate": dups,
        "outbox_seq_behind": behind,
        "duplicate_entry_id": sum(1 for v in entry_owners.values() if len(v) > 1),
        "inbox_window_full": window_full,
        "lost": lost,
        "duplicated": duplicated,
        "skew": max(partitions.values()) / (sum(partitions.values()) / 16) if partitions else 0,
    }


def _jvm_peak_mib(spark: Any) -> float | None:
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 0)
    return None


#: Documents per Spark partition read from the wire server at most: mongo-java-server
#: answers a cursor's batch with no 16 MiB cap, and the connector refuses a reply above
#: 48 MB (about 37,000 of these documents).
PER_PARTITION = 20_000


def _frames(
    spark: Any, uri: str, database: str, reader: str, partitions: int = 4
) -> tuple[Any, Any]:
    """The producer and consumer frames of ``reader`` (``parquet``: ``database`` is the
    snapshot's directory)."""
    from docoutbox_spark.readers import MongoTarget, read_mongo, read_snapshot

    if reader == "parquet":
        frames = read_snapshot(spark, database)
        return frames["producer"], frames["consumer"]
    return (
        read_mongo(spark, MongoTarget(uri, database, "producer"), reader, partitions=partitions),
        read_mongo(spark, MongoTarget(uri, database, "consumer"), reader, partitions=partitions),
    )


def _spark_audit(
    spark: Any, uri: str, database: str, reader: str, partitions: int = 4
) -> dict[str, Any]:
    from docoutbox_spark.run import AuditConfig, run_audit

    producer, consumer = _frames(spark, uri, database, reader, partitions)
    return run_audit(
        producer,
        consumer=consumer,
        config=AuditConfig(now=NOW, sla_seconds=SLA, window=WINDOW, partitions=16),
    )


def read_all(frame: Any) -> int:
    """Read every row and column of ``frame`` once and count the rows, in one Spark job:
    a ``noop`` write (``count()`` alone reads no column, and from Parquet no row, only the
    files' footers) whose row count is observed as it goes, so the source is not read a
    second time to count it."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation()
    frame.observe(seen, F.count(F.lit(1)).alias("rows")).write.format("noop").mode(
        "overwrite"
    ).save()
    return int(seen.get["rows"])


def _scan(spark: Any, uri: str, database: str, reader: str, partitions: int = 4) -> int:
    """A bare scan of the sources the audit reads: every row and column of each read
    once, and counted in the same job (:func:`read_all`)."""
    return sum(read_all(frame) for frame in _frames(spark, uri, database, reader, partitions))


def _check(spark_summary: dict[str, Any], baseline: dict[str, Any], reader: str) -> None:
    f = {k: v["count"] for k, v in spark_summary["findings"].items()}
    for kind in (
        "stuck",
        "retrying",
        "seq_gap",
        "seq_duplicate",
        "outbox_seq_behind",
        "duplicate_entry_id",
        "inbox_window_full",
        "lost",
        "duplicated",
    ):
        if f[kind] != baseline[kind]:
            raise AssertionError(f"{reader}: {kind} {f[kind]} != pymongo pass {baseline[kind]}")
    if spark_summary["totals"]["documents"] != baseline["documents"]:
        raise AssertionError(f"{reader}: documents differ from the pymongo pass")
    if spark_summary["totals"]["pending_entries"] != baseline["pending"]:
        raise AssertionError(f"{reader}: pending entries differ from the pymongo pass")


READERS = ("connector", "datasource", "parquet")


def run(uri: str, scale: Scale, sizes: list[int] | None = None) -> Table:
    import tempfile

    from docoutbox_spark.readers import MongoTarget, read_mongo, session, write_snapshot

    quick = scale.rounds <= 1
    sizes = sizes or ([300, 600] if quick else [25_000, 50_000, 100_000])
    table = Table(
        "audit",
        "Spark audit: seconds per run_audit (producer + consumer), per bare scan (one read "
        "that counts) of the same sources in the same session, and for a pymongo-only pass",
        [
            "documents",
            "pymongo pass s",
            *(f"{r} s" for r in READERS),
            *(f"{r} scan s" for r in READERS),
            *(f"{r} / scan" for r in READERS),
            "Parquet export s",
            "JVM peak MiB",
        ],
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session(jars=str(JARS), packages=False, master="local[2]", memory="2g")
    client = connect(uri)
    timings: dict[str, dict[int, float]] = defaultdict(dict)
    scans: dict[str, dict[int, float]] = defaultdict(dict)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-audit-") as scratch:
            warm = f"bench_audit_warm_{os.getpid()}"
            generate(client[warm], 200)
            for reader in ("connector", "datasource"):
                _spark_audit(spark, uri, warm, reader)
            client.drop_database(warm)
            for n in sizes:
                name = f"bench_audit_{n}_{os.getpid()}"
                generate(client[name], n)
                snapshot = str(Path(scratch) / name)
                start = time.perf_counter()
                write_snapshot(
                    {
                        role: read_mongo(spark, MongoTarget(uri, name, role), "datasource")
                        for role in ("producer", "consumer")
                    },
                    snapshot,
                )
                export = time.perf_counter() - start
                start = time.perf_counter()
                baseline = pymongo_pass(uri, name)
                timings["pymongo"][n] = time.perf_counter() - start
                for reader in READERS:
                    where = snapshot if reader == "parquet" else name
                    start = time.perf_counter()
                    parts = max(4, -(-n // PER_PARTITION))
                    _scan(spark, uri, where, reader, parts)
                    scans[reader][n] = time.perf_counter() - start
                    start = time.perf_counter()
                    summary = _spark_audit(spark, uri, where, reader, parts)
                    timings[reader][n] = time.perf_counter() - start
                    _check(summary, baseline, reader)
                client.drop_database(name)
                t = {k: v[n] for k, v in timings.items()}
                c = {k: v[n] for k, v in scans.items()}
                table.add(
                    n,
                    round(t["pymongo"], 2),
                    *(round(t[r], 2) for r in READERS),
                    *(round(c[r], 2) for r in READERS),
                    *(round(t[r] / c[r], 2) for r in READERS),
                    round(export, 2),
                    _jvm_peak_mib(spark),
                )
                print(f"[bench] audit {n}: {t} scans {c}", file=sys.stderr, flush=True)
    finally:
        client.close()
        spark.stop()
    small, large = sizes[0], sizes[-1]
    if large > small:
        growth = {k: round((v[large] / v[small]) / (large / small), 2) for k, v in timings.items()}
        table.figures["growth_vs_linear"] = growth
        table.notes.append(
            f"growth vs linear from {small} to {large} documents (1.0 = linear): "
            + ", ".join(f"{k} {v}" for k, v in sorted(growth.items()))
        )
    table.figures["sizes"] = sizes
    table.notes.append(
        "Every Spark run's finding counts, documents and pending entries are checked against "
        "the pymongo pass of the same run. Spark: local[2], driver memory 2g. The scan is a "
        "fresh read of every row and column of the producer and consumer sources, counted "
        "as they are read (one job per source, each read once), just before the audit. "
        "The Parquet snapshot is the typed layout `docoutbox export` writes (its scan reads "
        "every column, the typed outbox and inbox included); its export from the data "
        "source, timed apart, is not part of the audit."
    )
    return table


# --- scale: 100,000 and 1,000,000 documents from Parquet, bounded driver memory ---------

SCALE_SIZES = [100_000, 1_000_000]
#: Where the scale run keeps its snapshots (gitignored), made once and reused.
SCRATCH = Path(__file__).resolve().parents[1] / ".scratch" / "audit-scale"
DRIVER_MEMORY = "2g"


class PeakRss:
    """The peak of the summed resident memory of some processes, sampled from /proc, and
    each one's own high-water mark (``VmHWM``)."""

    def __init__(self, pids: list[int], every: float = 0.1) -> None:
        import threading

        self.pids = pids
        self.every = every
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _field(pid: int, name: str) -> int:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
        return 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = sum(self._field(pid, "VmRSS") for pid in self.pids)
            self.peak_kib = max(self.peak_kib, total)
            self._stop.wait(self.every)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def high_water_mib(self) -> list[float]:
        return [round(self._field(pid, "VmHWM") / 1024, 0) for pid in self.pids]


def scale_one(snapshot: Path, warm: Path) -> dict[str, Any]:
    """One size in a fresh Spark session (``local[2]``, driver memory ``DRIVER_MEMORY``):
    a warm-up audit of ``warm``, then a full scan (one counted read) of ``snapshot``'s
    sources and their audit, timed apart; the peak resident memory of the driver JVM and
    this Python process over the whole run."""
    from docoutbox_spark.readers import read_snapshot, session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session(jars=str(JARS), packages=False, master="local[2]", memory=DRIVER_MEMORY)
    gateway = spark.sparkContext._jvm
    assert gateway is not None, "a started session has a JVM"
    jvm = int(gateway.java.lang.ProcessHandle.current().pid())
    config = _config()
    try:
        with PeakRss([jvm, os.getpid()]) as rss:
            from docoutbox_spark.run import run_audit

            warm_frames = read_snapshot(spark, warm)
            run_audit(warm_frames["producer"], consumer=warm_frames["consumer"], config=config)
            start = time.perf_counter()
            read = _full_scan(spark, str(snapshot))
            scan = time.perf_counter() - start
            frames = read_snapshot(spark, snapshot)
            start = time.perf_counter()
            summary = run_audit(frames["producer"], consumer=frames["consumer"], config=config)
            seconds = time.perf_counter() - start
        return {
            "documents": summary["totals"]["documents"],
            "read": read,
            "audit_s": round(seconds, 2),
            "scan_s": round(scan, 2),
            "peak_rss_mib": round(rss.peak_kib / 1024, 0),
            "jvm_hwm_mib": rss.high_water_mib()[0],
            "python_hwm_mib": rss.high_water_mib()[1],
            "findings": {k: v["count"] for k, v in summary["findings"].items() if v["count"]},
        }
    finally:
        spark.stop()


def _config() -> Any:
    from docoutbox_spark.run import AuditConfig

    return AuditConfig(now=NOW, sla_seconds=SLA, window=WINDOW, partitions=16)


def _full_scan(spark: Any, snapshot: str) -> int:
    """Every row and column of the producer and consumer snapshots read once and counted
    (:func:`read_all`)."""
    from docoutbox_spark.readers import read_snapshot

    frames = read_snapshot(spark, snapshot)
    return sum(read_all(frames[role]) for role in ("producer", "consumer"))


def expected_findings(n: int) -> dict[str, int]:
    """The findings planted in :func:`documents` ``0..n-1``: entries older than the SLA
    and the lost seqs."""
    stuck = sum(
        1
        for i in range(n)
        for s in range(5 + i % 20 - i % 4 + 1, 5 + i % 20 + 1)
        if (i % 600) + s > SLA
    )
    lost = sum(1 for i in range(n) if i % LOST_EVERY == 2)
    return {"stuck": stuck, "lost": lost}


def run_scale(uri: str, scale: Scale, sizes: list[int] | None = None) -> Table:
    """The audit of Parquet snapshots of growing size, each in its own driver process:
    time against linear growth, time against a full scan, and the driver's peak memory.
    ``uri`` is unused (no database)."""
    import subprocess

    sizes = sizes or ([2_000, 20_000] if scale.rounds <= 1 else SCALE_SIZES)
    table = Table(
        "audit-scale",
        "Spark audit from Parquet at scale: producer documents plus as many consumer "
        f"documents, local[2], driver memory {DRIVER_MEMORY}, one driver process per size",
        [
            "producer documents",
            "audit s",
            "full scan s",
            "audit / scan",
            "peak RSS MiB (JVM + Python)",
            "JVM high-water MiB",
        ],
    )
    warm = _typed_snapshot(1000)
    results: dict[int, dict[str, Any]] = {}
    exports: dict[int, float] = {}
    for n in sizes:
        snapshot = _typed_snapshot(n, exports)
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.audit", "--scale-one", str(snapshot), str(warm)],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        expected = expected_findings(n)
        if result["documents"] != n or result["read"] != 2 * n or result["findings"] != expected:
            raise AssertionError(f"audit of {n}: {result} (expected {expected})")
        results[n] = result
        print(f"[bench] audit-scale {n}: {result}", file=sys.stderr, flush=True)
        table.add(
            n,
            result["audit_s"],
            result["scan_s"],
            round(result["audit_s"] / result["scan_s"], 2),
            result["peak_rss_mib"],
            result["jvm_hwm_mib"],
        )
    small, large = sizes[0], sizes[-1]
    if large > small:
        growth = (results[large]["audit_s"] / results[small]["audit_s"]) / (large / small)
        table.figures["growth_vs_linear"] = round(growth, 2)
        table.notes.append(
            f"time({large:,}) / ({large // small} x time({small:,})) = {growth:.2f} (1.0 = linear)"
        )
    table.figures["sizes"] = sizes
    if exports:
        table.figures["export_s"] = {str(n): round(v, 2) for n, v in exports.items()}
        table.notes.append(
            "The typed snapshots' export from raw rows (a driver process of its own, apart "
            "from the audit): "
            + ", ".join(f"{n:,} documents {v:.1f} s" for n, v in sorted(exports.items()))
        )
    table.notes.append(
        "Each size runs in a fresh driver process (JVM start and a warm-up audit of 1,000 "
        "documents excluded from the times, included in the memory). The full scan reads "
        "every row and column of both snapshots once (a noop write) and counts them as it "
        "goes, in the same session just before the audit. Findings are checked against "
        "those planted. Peak RSS: the summed resident memory of the driver JVM and the "
        "Python driver process, sampled every 0.1 s."
    )
    return table


def _typed_snapshot(n: int, exports: dict[int, float] | None = None) -> Path:
    """The typed snapshot of ``n`` producer documents (and as many consumers), made once:
    raw rows written by :func:`generate_snapshot`, then exported in a driver process of
    its own (:func:`export_one`), whose seconds go to ``exports``."""
    import subprocess

    raw, typed = SCRATCH / f"raw-{n}", SCRATCH / f"typed-{n}"
    if not (raw / "consumer").exists():
        start = time.perf_counter()
        generate_snapshot(raw, n)
        print(
            f"[bench] audit-scale: wrote {n} raw in {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    if not (typed / "consumer").exists():
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.audit", "--export-one", str(raw), str(typed)],
            check=True,
            capture_output=True,
            text=True,
        )
        seconds = float(json.loads(out.stdout.strip().splitlines()[-1])["export_s"])
        if exports is not None:
            exports[n] = seconds
        print(f"[bench] audit-scale: exported {n} in {seconds:.1f} s", file=sys.stderr)
    return typed


def export_one(raw: Path, typed: Path) -> dict[str, Any]:
    """A raw snapshot written again in the typed layout (``write_snapshot``), timed, in a
    fresh Spark session like :func:`scale_one`'s."""
    from docoutbox_spark.readers import read_snapshot, session, write_snapshot

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = session(jars=str(JARS), packages=False, master="local[2]", memory=DRIVER_MEMORY)
    try:
        start = time.perf_counter()
        counts = write_snapshot(read_snapshot(spark, raw), typed)
        return {"export_s": round(time.perf_counter() - start, 2), "counts": counts}
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.audit", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument(
        "--scale", action="store_true", help="the Parquet scale run (100,000 and 1,000,000)"
    )
    parser.add_argument("--scale-one", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--export-one", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results.json"
    )
    args = parser.parse_args(argv)
    if args.scale_one:
        print(json.dumps(scale_one(*args.scale_one)))
        return 0
    if args.export_one:
        print(json.dumps(export_one(*args.export_one)))
        return 0
    scale = Scale.quick() if args.quick else Scale()
    if args.scale:
        table = run_scale("", scale, args.sizes)
    else:
        with mongo_server(java_heap="6g") as uri:
            table = run(uri, scale, args.sizes)
    print(table.to_markdown())
    results = json.loads(args.out.read_text()) if args.out.exists() else {"benchmarks": {}}
    results.setdefault("benchmarks", {})[table.key] = table.to_json()
    results["benchmarks"][table.key]["generated_at"] = datetime.now(UTC).isoformat(
        timespec="seconds"
    )
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
