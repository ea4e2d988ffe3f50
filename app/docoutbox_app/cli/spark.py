"""``docoutbox audit`` and ``docoutbox export``.

- ``audit`` reads a producer collection (plus, optionally, a consumer collection and the
  dead letters) from MongoDB, through the MongoDB Spark connector (``--reader
  connector``) or the project's pymongo data source (``--reader datasource``), from
  Cosmos DB containers through the project's azure-cosmos data source (``--reader
  cosmos``, the default with ``--cosmos-endpoint``), or a Parquet snapshot
  (``--from-parquet DIR``); writes a JSON summary and an HTML report.
- ``export`` writes such a snapshot: ``DIR/producer``, ``DIR/consumer``,
  ``DIR/dead_letters`` (raw rows, so malformed documents survive) and ``DIR/manifest.json``
  (the collections' document counts, checked again when the snapshot is audited). Values
  encoded by a store codec (:mod:`docoutbox.stored`) are written as stored; with
  ``--decode module:name`` (the service's codec and upcasters) the producer and consumer
  states and entries are written decoded and upcast. Dead letters stay as stored.

The audit reads metadata only, so it runs on encoded documents as they are.

Exit codes: 0 when no finding crosses its threshold, 3 when one does, 1 when the data
cannot be read, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from docoutbox.errors import DocOutboxError, InvalidConfig
from docoutbox_app import logs
from docoutbox_app.cli.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    PARTITIONS,
    Parser,
    add_cosmos_options,
    number,
    stored_values,
)

EXIT_FINDINGS = 3
#: Spark refuses a driver heap under 450 MiB ("Insufficient driver memory").
MIN_DRIVER_MEMORY = 512 * 2**20
_MEMORY = re.compile(r"([1-9][0-9]{0,15})([kmgt])", re.IGNORECASE)
_MASTER = re.compile(
    r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|local-cluster\[.+\]|yarn"
    r"|(spark|k8s|mesos)://.+"
)


def driver_memory(text: str) -> str:
    """An argparse type: a JVM heap size (``-Xmx`` syntax) Spark accepts for its driver."""
    match = _MEMORY.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a JVM heap size (a number with k, m, g or t, like 2g): {text!r}"
        )
    unit = " kmgt".index(match.group(2).lower())  # a bare number would be bytes to -Xmx
    if int(match.group(1)) * 1024**unit < MIN_DRIVER_MEMORY:
        raise argparse.ArgumentTypeError(f"Spark needs at least 512m: {text}")
    return text


def spark_master(text: str) -> str:
    """An argparse type: a Spark master URL (``local[4]``, ``local[*]``, ``spark://...``)."""
    if _MASTER.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"not a Spark master (local, local[N], local[*], spark://host:port, yarn, "
            f"k8s://...): {text!r}"
        )
    return text


class AuditError(DocOutboxError):
    """The audit could not read or write its data."""


def _common(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument(
        "--mongo-uri",
        default=env("DOCOUTBOX_MONGO_URI"),
        help="MongoDB URI (or DOCOUTBOX_MONGO_URI)",
    )
    add_cosmos_options(p)
    p.add_argument("--db", "--database", dest="db")
    p.add_argument(
        "--collection", "--container", dest="collection", help="the producer (aggregate) collection"
    )
    p.add_argument(
        "--consumer-collection",
        "--consumer-container",
        dest="consumer_collection",
        help="a consumer collection to reconcile against",
    )
    p.add_argument("--dead-letters", help="the dead-letter collection (docoutbox_dead_letters)")
    p.add_argument(
        "--spilled",
        action="store_true",
        help="the consumers spill their inbox (InboxPolicy(spill=True)): read the IDs in "
        "the consumer collection's archive (<consumer collection>.inbox) too",
    )
    p.add_argument(
        "--reader",
        choices=["connector", "datasource", "cosmos"],
        help="connector (default with --mongo-uri), datasource (pymongo), or cosmos (default "
        "with --cosmos-endpoint)",
    )
    p.add_argument(
        "--read-partitions",
        type=number(int, 1, high=100_000),
        default=4,
        help="Spark partitions per read",
    )
    p.add_argument(
        "--spark-jars",
        default=env("DOCOUTBOX_SPARK_JARS"),
        help="directory or comma-separated jars with the MongoDB Spark connector "
        "(default: resolved from Maven Central)",
    )
    p.add_argument("--spark-master", type=spark_master, default="local[*]")
    p.add_argument("--driver-memory", type=driver_memory, default="1g")
    p.add_argument(
        "--progress-interval",
        type=NON_NEGATIVE,
        default=5.0,
        help="seconds between progress lines on stderr (0: none)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own log lines (WARN and above) and its progress bar",
    )


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="docoutbox")
    sub = top.add_subparsers(dest="command", required=True)
    a = sub.add_parser(
        "audit", help="audit collections with Spark: stuck, lost, duplicated, near a limit"
    )
    _common(a)
    a.add_argument("--from-parquet", metavar="DIR", help="audit a snapshot written by export")
    a.add_argument("--report", metavar="HTML", help="write the HTML report here")
    a.add_argument("--json", metavar="JSON", help="write the JSON summary here")
    a.add_argument(
        "--sla", type=NON_NEGATIVE, default=300.0, help="seconds an entry may stay pending"
    )
    a.add_argument("--window", type=AT_LEAST_ONE, default=100, help="the consumers' inbox window")
    a.add_argument(
        "--above-limit",
        type=number(int, 0),
        default=100,
        help="exact-mode 'above' set size that counts as saturation",
    )
    a.add_argument("--size-limit", choices=["mongodb", "cosmos"], default="mongodb")
    a.add_argument(
        "--size-fraction",
        type=number(float, 0, strict=True, high=1),
        default=0.8,
        help="a document above this fraction of the size limit is a finding",
    )
    a.add_argument(
        "--partitions", type=PARTITIONS, help="dispatcher partitions (StoreConfig.partitions)"
    )
    a.add_argument(
        "--skew-ratio",
        type=number(float, 1),
        default=4.0,
        help="a partition with this multiple of the mean backlog is a finding",
    )
    a.add_argument(
        "--skew-min-pending",
        type=number(int, 0),
        default=100,
        help="report skew only when at least this many entries are pending",
    )
    a.add_argument("--now", type=_instant, help="audit as of this ISO 8601 instant (default: now)")
    a.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="KIND=N",
        help="allow N findings of KIND (or 'none': never fail on it); repeatable",
    )
    e = sub.add_parser("export", help="write a Parquet snapshot of the collections")
    _common(e)
    e.add_argument("--out", required=True, metavar="DIR")
    e.add_argument(
        "--decode",
        metavar="MODULE:NAME",
        help="a docoutbox.stored.StoredValues (or Codec, or Upcasters) of your service: the "
        "states and entries of the producer and consumer collections are written decoded "
        "(PLAINTEXT) and upcast; by default they are written as stored (encoded)",
    )
    return top


def _instant(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _unwritable(option: str, path: str, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be written (checked before Spark reads anything), or None."""
    target = Path(path)
    if not directory and target.is_dir():
        return f"{option} {path}: is a directory"
    if directory and target.exists() and not target.is_dir():
        return f"{option} {path}: exists and is not a directory"
    where = target if directory and target.is_dir() else target.parent
    where = where if str(where) else Path(".")
    if not where.is_dir():
        return f"{option} {path}: no such directory: {where}"
    if not os.access(where, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        return f"{option} {path}: not writable"
    return None


def _outputs(args: argparse.Namespace) -> str | None:
    if args.command == "export":
        return _unwritable("--out", args.out, directory=True)
    for option, path in (("--report", args.report), ("--json", args.json)):
        problem = path is not None and _unwritable(option, path)
        if problem:
            return problem
    return None


def _thresholds(items: list[str]) -> dict[str, int | None]:
    from docoutbox_spark.run import DEFAULT_THRESHOLDS  # noqa: PLC0415

    out = dict(DEFAULT_THRESHOLDS)
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or kind not in out:
            raise ValueError(
                f"--threshold {item!r}: expected KIND=N with KIND one of {', '.join(out)}"
            )
        if value == "none":
            out[kind] = None
        elif value.isdigit():
            out[kind] = int(value)
        else:
            raise ValueError(f"--threshold {item!r}: N must be a non-negative integer or 'none'")
    return out


def _check(args: argparse.Namespace) -> str | None:
    problem = _outputs(args)
    if problem:
        return problem
    if args.command == "audit" and args.from_parquet:
        return (
            None if Path(args.from_parquet).is_dir() else f"{args.from_parquet} is not a directory"
        )
    args.reader = args.reader or ("cosmos" if args.cosmos_endpoint else "connector")
    if args.reader == "cosmos":
        return _check_cosmos(args)
    if args.cosmos_endpoint:
        return f"--cosmos-endpoint needs --reader cosmos, not {args.reader}"
    if not (args.mongo_uri and args.db and args.collection):
        return "--mongo-uri (or DOCOUTBOX_MONGO_URI), --db and --collection are required"
    return _check_jars(args.spark_jars) if args.reader == "connector" else None


def _check_jars(jars: str | None) -> str | None:
    """Why the connector's ``--spark-jars`` (a directory, or a comma-separated list of jars
    and URLs) cannot serve, or None: Spark itself only warns, then fails to find the
    connector, or downloads it from Maven Central, which the user did not ask for."""
    if not jars:
        return None
    if os.path.isdir(jars):
        return None if any(Path(jars).glob("*.jar")) else f"--spark-jars: {jars} holds no .jar"
    for jar in jars.split(","):
        if jar and "://" not in jar and not os.path.isfile(jar):
            return f"--spark-jars: no such directory or file: {jar}"
    return None


def _check_cosmos(args: argparse.Namespace) -> str | None:
    if not (args.cosmos_endpoint and args.cosmos_key and args.db and args.collection):
        return (
            "--reader cosmos needs --cosmos-endpoint and --cosmos-key (or COSMOS_ENDPOINT and "
            "COSMOS_KEY), --database and --container"
        )
    if args.cosmos_ca_file and args.cosmos_insecure:
        return "give either --cosmos-ca-file or --cosmos-insecure, not both"
    if args.cosmos_ca_file and not os.path.isfile(args.cosmos_ca_file):
        return f"--cosmos-ca-file: no such file: {args.cosmos_ca_file}"
    return None


@contextmanager
def progress(spark: Any, interval: float, label: str) -> Iterator[None]:
    """Print how far the audit is to stderr every ``interval`` seconds: the Spark jobs and
    tasks completed so far (counts that only grow), and the tasks running."""
    if interval <= 0:
        yield
        return
    stop = threading.Event()
    started = time.monotonic()
    context = spark.sparkContext
    group = f"docoutbox-{label}-{os.getpid()}-{time.time_ns()}"
    context.setJobGroup(group, f"docoutbox {label}")

    def loop() -> None:
        tracker = context.statusTracker()
        done: dict[int, int] = {}  # stage -> tasks completed, highest seen
        while not stop.wait(interval):
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
            finished = sum(1 for j in jobs if j is not None and j.status == "SUCCEEDED")
            running = 0
            for job in jobs:
                for stage_id in job.stageIds if job is not None else ():
                    stage = tracker.getStageInfo(stage_id)
                    if stage is None:
                        continue
                    done[stage_id] = max(done.get(stage_id, 0), stage.numCompletedTasks)
                    running += stage.numActiveTasks
            elapsed = time.monotonic() - started
            print(
                f"docoutbox: {label} {elapsed:.0f}s: {finished} Spark jobs done, "
                f"{sum(done.values())} tasks done, {running} running",
                file=sys.stderr,
                flush=True,
            )

    thread = threading.Thread(target=loop, name="audit-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)


def _frames(
    spark: Any, args: argparse.Namespace
) -> tuple[dict[str, Any], int | None, dict[str, Any]]:
    from docoutbox_spark.readers import MongoTarget, count_documents, read_mongo, read_snapshot  # noqa: PLC0415

    if getattr(args, "from_parquet", None):
        frames = read_snapshot(spark, args.from_parquet)
        if "producer" not in frames:
            raise AuditError(f"{args.from_parquet} holds no producer/ snapshot")
        manifest = Path(args.from_parquet) / "manifest.json"
        expected = None
        if manifest.is_file():
            expected = json.loads(manifest.read_text()).get("collection_counts", {}).get("producer")
        return frames, expected, {"parquet": str(args.from_parquet)}
    if args.reader == "cosmos":
        return _cosmos_frames(spark, args)
    frames = {}
    target = MongoTarget(args.mongo_uri, args.db, args.collection)
    expected = count_documents(target)
    frames["producer"] = read_mongo(spark, target, args.reader, partitions=args.read_partitions)
    if args.consumer_collection:
        frames["consumer"] = read_mongo(
            spark,
            MongoTarget(args.mongo_uri, args.db, args.consumer_collection),
            args.reader,
            partitions=args.read_partitions,
        )
    if args.consumer_collection and getattr(args, "spilled", False):
        from docoutbox_spark.spilled import read_mongo_archive  # noqa: PLC0415

        frames["consumer_archive"] = read_mongo_archive(
            spark,
            MongoTarget(args.mongo_uri, args.db, args.consumer_collection),
            partitions=args.read_partitions,
        )
    if args.dead_letters:
        frames["dead_letters"] = read_mongo(
            spark,
            MongoTarget(args.mongo_uri, args.db, args.dead_letters),
            args.reader,
            dead_letters=True,
            partitions=args.read_partitions,
        )
    source = {
        "db": args.db,
        "collection": args.collection,
        "reader": args.reader,
        "consumer_collection": args.consumer_collection,
        "dead_letters": args.dead_letters,
    }
    return frames, expected, source


def _cosmos_frames(
    spark: Any, args: argparse.Namespace
) -> tuple[dict[str, Any], int | None, dict[str, Any]]:
    from docoutbox_spark.readers import CosmosTarget, count_items, read_cosmos  # noqa: PLC0415

    def target(container: str) -> CosmosTarget:
        return CosmosTarget(
            args.cosmos_endpoint,
            args.cosmos_key,
            args.db,
            container,
            verify=not args.cosmos_insecure,
            discovery=not args.cosmos_endpoint.startswith("http://"),
            ca_file=args.cosmos_ca_file,
        )

    expected = count_items(target(args.collection))  # first: a missing container fails fast
    frames = {"producer": read_cosmos(spark, target(args.collection))}
    if args.consumer_collection:
        frames["consumer"] = read_cosmos(spark, target(args.consumer_collection))
        if getattr(args, "spilled", False):
            from docoutbox_spark.spilled import read_cosmos_archive  # noqa: PLC0415

            frames["consumer_archive"] = read_cosmos_archive(
                spark, target(args.consumer_collection)
            )
    if args.dead_letters:
        frames["dead_letters"] = read_cosmos(spark, target(args.dead_letters), "dead_letters")
    source = {
        "cosmos_endpoint": logs.mask(args.cosmos_endpoint, [args.cosmos_key]),
        "database": args.db,
        "container": args.collection,
        "reader": args.reader,
        "consumer_container": args.consumer_collection,
        "dead_letters": args.dead_letters,
    }
    return frames, expected, source


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    secrets = logs.secrets_of(args.mongo_uri) + ([args.cosmos_key] if args.cosmos_key else [])
    problem = _check(args)
    thresholds: dict[str, int | None] = {}
    if problem is None and args.command == "audit":
        try:
            thresholds = _thresholds(args.threshold)
        except ValueError as exc:
            problem = str(exc)
    if problem is None and args.command == "export" and args.decode:
        try:
            args.decode = stored_values(args.decode)
        except InvalidConfig as exc:
            problem = str(exc)
    if problem:
        print(f"docoutbox: error: {logs.mask(problem, secrets)}", file=sys.stderr)
        return 2
    if args.cosmos_insecure:
        print(
            "docoutbox: WARNING: --cosmos-insecure: the Cosmos DB certificate is NOT checked; "
            "anyone on the path can read the key and the data",
            file=sys.stderr,
        )
    try:
        from docoutbox_spark.readers import session  # noqa: PLC0415
    except ImportError as exc:
        print(
            f"docoutbox: error: the Spark adapter needs pip install 'docoutbox[spark]' ({exc})",
            file=sys.stderr,
        )
        return 1
    from py4j.protocol import Py4JError  # noqa: PLC0415
    from pyspark.errors import PySparkException  # noqa: PLC0415
    from pyspark.sql import SparkSession  # noqa: PLC0415

    owned = SparkSession.getActiveSession() is None
    # Only the connector reader needs a Maven package; the others resolve nothing.
    connector = args.reader == "connector" and not getattr(args, "from_parquet", None)
    try:
        spark = session(
            jars=args.spark_jars if connector else None,
            master=args.spark_master,
            memory=args.driver_memory,
            packages=connector,
            verbose=args.verbose,
        )
    except (PySparkException, Py4JError) as exc:
        return _failed("cannot start Spark", exc, secrets)
    try:
        with progress(spark, args.progress_interval, args.command):
            if args.command == "export":
                return _export(spark, args)
            return _audit(spark, args, thresholds)
    except (DocOutboxError, OSError) as exc:
        print(f"docoutbox: error: {logs.mask(str(exc), secrets)}", file=sys.stderr)
        return 1
    except Exception as exc:
        from pymongo.errors import PyMongoError  # noqa: PLC0415

        if not isinstance(exc, PySparkException | PyMongoError):
            raise
        return _failed("cannot read", exc, secrets)
    finally:
        if owned:
            # The session's gateway too: SparkSession.stop() leaves its JVM and a py4j
            # thread running in the process that called main().
            from docoutbox_spark.readers import end_session  # noqa: PLC0415

            left = end_session(spark)
            if left:
                print(f"docoutbox: warning: py4j threads still running: {left}", file=sys.stderr)


def _failed(what: str, exc: Exception, secrets: list[str]) -> int:
    """Spark's or the driver's error as one masked line (their messages span many)."""
    text = logs.mask(" ".join(str(exc).split())[:500], secrets)
    print(f"docoutbox: error: {what}: {text}", file=sys.stderr)
    return 1


def _audit(spark: Any, args: argparse.Namespace, thresholds: dict[str, int | None]) -> int:
    from docoutbox_spark.audit import COSMOS_LIMIT, MONGODB_LIMIT  # noqa: PLC0415
    from docoutbox_spark.report import write_html, write_json  # noqa: PLC0415
    from docoutbox_spark.run import AuditConfig, run_audit  # noqa: PLC0415

    frames, expected, source = _frames(spark, args)
    config = AuditConfig(
        now=args.now or datetime.now(UTC),
        sla_seconds=args.sla,
        window=args.window,
        above_limit=args.above_limit,
        size_limit=COSMOS_LIMIT if args.size_limit == "cosmos" else MONGODB_LIMIT,
        size_fraction=args.size_fraction,
        partitions=args.partitions,
        skew_ratio=args.skew_ratio,
        skew_min_pending=args.skew_min_pending,
        thresholds=thresholds,
    )
    summary = run_audit(
        frames["producer"],
        consumer=frames.get("consumer"),
        dead_letters=frames.get("dead_letters"),
        consumer_archive=frames.get("consumer_archive"),
        expected_documents=expected,
        config=config,
        source=source,
    )
    if args.json:
        write_json(summary, args.json)
    if args.report:
        write_html(summary, args.report)
    counts = {k: v["count"] for k, v in summary["findings"].items() if v["count"]}
    print(
        f"audit: {summary['totals']['documents']} documents, "
        f"{summary['totals']['pending_entries'] or 0} pending entries; findings: "
        + (", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none")
    )
    if "reconciliation" in summary:
        from docoutbox_spark.report import reconciliation_text  # noqa: PLC0415

        print(f"reconciliation: {reconciliation_text(summary['reconciliation'])}")
    if args.report:
        print(f"report: {Path(args.report).resolve()}")
    if args.json:
        print(f"summary: {Path(args.json).resolve()}")
    if summary["failed"]:
        print(f"audit: FAILED ({', '.join(summary['failed'])} above threshold)")
        return EXIT_FINDINGS
    return 0


def _export(spark: Any, args: argparse.Namespace) -> int:
    from docoutbox_spark.readers import write_snapshot  # noqa: PLC0415

    frames, collection_count, source = _frames(spark, args)
    if args.decode is not None:
        from docoutbox_spark.stored import open_values  # noqa: PLC0415

        for name in ("producer", "consumer"):
            if name in frames:
                frames[name] = open_values(frames[name], args.decode)
        source["decoded"] = True
    expected = {"producer": collection_count or 0}
    counts = write_snapshot(frames, args.out)
    manifest = {"source": source, "counts": counts, "collection_counts": expected}
    Path(args.out, "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"export: {counts} rows written to {Path(args.out).resolve()}")
    if counts["producer"] < expected["producer"]:
        print(
            f"export: {expected['producer'] - counts['producer']} documents were not read",
            file=sys.stderr,
        )
        return 1
    return 0
