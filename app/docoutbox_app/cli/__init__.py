"""The ``docoutbox`` command.

- ``docoutbox dispatch``: publish the outbox entries of one collection, until
  SIGTERM or SIGINT (then finish in-flight work, checkpoint, release leases, exit 0);
- ``docoutbox run module:endpoint ...``: run endpoints (consumers, dispatchers, health)
  in one process (:mod:`docoutbox_app.cli.run`);
- ``docoutbox demo``: the runnable demonstration (:mod:`docoutbox_app.cli.demo`);
- ``docoutbox outbox stats``, ``docoutbox dead-letters ...``, ``docoutbox leases``: see and
  repair the outbox (:mod:`docoutbox_app.cli.admin`);
- ``docoutbox audit`` / ``docoutbox export``: the Spark audit (:mod:`docoutbox_app.cli.audit`).

Its modules: :mod:`docoutbox_app.cli.options` (argument types and store options),
:mod:`docoutbox_app.cli.help` (the help formatter), :mod:`docoutbox_app.logs` (log
set-up, masked secrets), :mod:`docoutbox_app.cli.observe` (progress, metrics, health),
:mod:`docoutbox_app.cli.spark` (``audit`` and ``export`` on the Spark adapter).

Exit codes: 0 after a clean stop, 1 when a server cannot be used (MongoDB or the broker
unreachable, credentials refused, a missing exchange: one ``docoutbox: error:`` line on
stderr, within seconds), 2 for bad arguments (checked before connecting).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from docoutbox import __version__
from docoutbox.codec import WireFormat, encode_entry
from docoutbox.dispatch.engine.backlog import BacklogProbe, probe_backend
from docoutbox.dispatch.engine.lag import PendingWorkProbe
from docoutbox.dispatch.engine.leases import LeaseTiming
from docoutbox.errors import BrokerUnavailable, DocOutboxError, InvalidConfig, PartitionMismatch
from docoutbox.model import OutboxMessage
from docoutbox.ports.dispatch import Closeable, Publisher
from docoutbox.ports.kit import (
    BrokerSettings,
    MeasuredKit,
    PendingWorkKit,
    StoreAdapter,
    StoreKit,
    StoreSettings,
)
from docoutbox_app import logs, registry
from docoutbox_app.cli import admin, audit, observe
from docoutbox_app.cli import run as run_command
from docoutbox_app.cli.help import Formatter
from docoutbox_app.cli.options import (
    ANY_COLLECTION,
    ANY_DATABASE,
    AT_LEAST_ONE,
    GRACE,
    INTERVAL,
    PARTITIONS,
    SERVER_TIMEOUT_HELP,
    TIMEOUT,
    KeyValues,
    Parser,
    add_cosmos_options,
    add_store_options,
    connection_problem,
    key_value,
    names_problem,
    store_of,
    stored_values,
)
from docoutbox_app.registry import AdapterMissing
from docoutbox_app.wiring import DispatchOptions, build_async_dispatcher, build_dispatcher

log = logging.getLogger("docoutbox_app.cli")
#: What a dispatcher follows, by store: its ``mode`` in the start line.
FOLLOWS = {"mongo": "change-stream", "cosmos": "change-feed"}


class CountingPublisher:
    """Accepts every entry and counts it (demos, benchmarks, dry runs)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def publish(self, entry: OutboxMessage) -> None:
        with self._lock:
            self.count += 1
        log.debug("published entry=%s aggregate=%r seq=%d", entry.id, entry.aggregate_id, entry.seq)


class StdoutPublisher:
    """Writes each entry as one JSON line to stdout (the broker body).

    When the reader goes away (``| head``: a broken pipe) nothing more can be delivered:
    the entry is held (``BrokerUnavailable``, never counted against it) and
    ``on_closed`` is called once, so that the command stops instead of failing every
    entry.
    """

    def __init__(self, on_closed: Any = None) -> None:
        self._lock = threading.Lock()
        self.on_closed = on_closed
        self.closed: OSError | None = None

    def publish(self, entry: OutboxMessage) -> None:
        line = encode_entry(entry).decode() + "\n"
        with self._lock:
            if self.closed is not None:
                raise BrokerUnavailable(f"stdout is closed: {self.closed}")
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except OSError as exc:
                self.closed = exc
                # Python would report the unflushed line again at exit.
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
                if self.on_closed is not None:
                    self.on_closed()
                raise BrokerUnavailable(f"stdout is closed: {exc}") from exc


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="docoutbox",
        description="Exactly-once message processing on document databases.",
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the demonstration (docoutbox demo --help)")
    audit.register(sub)
    d = sub.add_parser(
        "dispatch",
        help="publish pending outbox entries of a collection",
        formatter_class=Formatter,
        epilog=(
            "Modes: with change streams (a replica set) entries are published as they are "
            "committed, and a sweep every --sweep-interval seconds catches anything older "
            "than --grace. With --poll-interval SECONDS (for deployments without change "
            "streams) there is no stream: every SECONDS the dispatcher sweeps all pending "
            "entries, so a new entry is published within about that long."
        ),
    )
    env = os.environ.get
    d.add_argument(
        "--mongo-uri",
        default=env("DOCOUTBOX_MONGO_URI"),
        help="MongoDB URI (or DOCOUTBOX_MONGO_URI, which keeps it out of the process list)",
    )
    add_cosmos_options(d)
    add_store_options(d)
    d.add_argument("--db", "--database", dest="db", type=ANY_DATABASE)
    d.add_argument("--collection", "--container", dest="collection", type=ANY_COLLECTION)
    d.add_argument(
        "--publisher",
        required=True,
        choices=sorted({"stdout", "memory", *registry.names(registry.BROKERS)}),
        help="where entries go: a broker adapter registered in the docoutbox.brokers entry "
        "point group, stdout (JSON lines), or 'memory', which publishes NOWHERE (entries "
        "are counted and trimmed): demos and tests only, and only with --discard-entries",
    )
    d.add_argument(
        "--broker-url",
        default=env("DOCOUTBOX_BROKER_URL"),
        help="the broker's address, for broker adapters other than rabbitmq and kafka (or "
        "DOCOUTBOX_BROKER_URL)",
    )
    d.add_argument(
        "--broker-option",
        metavar="KEY=VALUE",
        type=key_value,
        action=KeyValues,
        help="a setting of the broker adapter's own (repeatable); for kafka a librdkafka "
        "setting (linger.ms is 5 unless set here)",
    )
    d.add_argument(
        "--discard-entries",
        action="store_true",
        help="required with --publisher memory: confirms that entries are trimmed undelivered",
    )
    d.add_argument("--rabbitmq-url", default=env("DOCOUTBOX_RABBITMQ_URL"))
    d.add_argument("--exchange", default="")
    d.add_argument(
        "--declare-exchange",
        metavar="TYPE",
        choices=["topic", "direct", "fanout", "headers"],
        help="declare the exchange (durable, of this type) at start-up instead of requiring it",
    )
    d.add_argument(
        "--routing-key", help="routing key for entries without a destination (default: type)"
    )
    d.add_argument(
        "--kafka-bootstrap",
        default=env("DOCOUTBOX_KAFKA_BOOTSTRAP"),
        help="Kafka bootstrap servers (or DOCOUTBOX_KAFKA_BOOTSTRAP)",
    )
    d.add_argument("--topic", help="Kafka topic for entries without a destination (default: type)")
    d.add_argument(
        "--wire",
        choices=[str(w) for w in WireFormat],
        default=str(WireFormat.PLAIN),
        help="message format: docoutbox JSON, or a CloudEvent (structured or binary mode)",
    )
    d.add_argument("--name", help="dispatcher name (its checkpoint); default dispatch:DB.COLL")
    d.add_argument(
        "--partitions", type=PARTITIONS, default=16, help="must match the stores' config"
    )
    d.add_argument("--lease-ttl", type=TIMEOUT, default=10.0, help="seconds; failover time")
    d.add_argument("--no-leases", action="store_true", help="single instance: own every partition")
    d.add_argument(
        "--concurrency", type=AT_LEAST_ONE, default=32, help="workers publishing in parallel"
    )
    d.add_argument(
        "--run-batch",
        type=AT_LEAST_ONE,
        default=16,
        help="aggregates a worker publishes before trimming them together",
    )
    d.add_argument(
        "--async",
        dest="use_async",
        action="store_true",
        help="run the asyncio dispatcher (pymongo's AsyncMongoClient or azure.cosmos.aio; "
        "publisher in threads)",
    )
    d.add_argument("--sweep-interval", type=INTERVAL, default=60.0, help="seconds")
    d.add_argument("--grace", type=GRACE, default=30.0, help="sweep entries older than this (s)")
    d.add_argument(
        "--poll-interval",
        type=INTERVAL,
        help="polling mode, without change streams: sweep every this many seconds, no grace",
    )
    d.add_argument(
        "--max-stream-wait",
        type=INTERVAL,
        help="while reads of the change stream bring nothing, space them out up to this many "
        "seconds (default: read every 0.05 s)",
    )
    d.add_argument(
        "--max-attempts", type=AT_LEAST_ONE, default=5, help="publish attempts per entry"
    )
    d.add_argument("--checkpoint-interval", type=INTERVAL, default=1.0, help="seconds")
    d.add_argument(
        "--due-interval",
        type=INTERVAL,
        default=0.5,
        help="query for scheduled messages fallen due every this many seconds",
    )
    d.add_argument(
        "--decode",
        metavar="MODULE:NAME",
        help="the stores' docoutbox.stored.StoredValues (or Codec, or Upcasters): entries "
        "they encoded are published decoded, old payloads upcast",
    )
    d.add_argument(
        "--trim-delay",
        type=GRACE,
        default=0.002,
        help="write trims behind the publishes within this many seconds (default 0.002; "
        "0: each run trims before it ends)",
    )
    d.add_argument(
        "--max-untrimmed",
        type=AT_LEAST_ONE,
        default=2_000,
        help="published entries waiting for their deferred trim, at most",
    )
    d.add_argument(
        "--claim-check",
        action="store_true",
        help="resolve claim-checked entries from the collection's payload store, and delete "
        "their payloads after the trim",
    )
    d.add_argument(
        "--publish-references",
        action="store_true",
        help="with --claim-check: publish claim-checked entries' reference envelopes, for "
        "consumers that fetch payloads (the orphan sweep removes them)",
    )
    d.add_argument("--server-timeout", type=TIMEOUT, help=SERVER_TIMEOUT_HELP)
    d.add_argument(
        "--broker-timeout", type=TIMEOUT, default=5.0, help="seconds to reach the broker"
    )
    d.add_argument("--progress-interval", type=INTERVAL, default=10.0, help="seconds")
    d.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    observe.add_arguments(d)
    admin.add_commands(sub)
    run_command.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        from docoutbox_app.cli import demo  # noqa: PLC0415 - pymongo, on use

        code: int = demo.main(args_list[1:])
        return code
    if args_list[:1] and args_list[0] in audit.COMMANDS:
        return audit.main(args_list)
    args = _parser().parse_args(args_list)
    run: admin.Runner | None = getattr(args, "run", None)
    if run is not None:
        try:
            return run(args)
        except KeyboardInterrupt:
            # Each command's writes are single database commands: nothing is half done.
            print("docoutbox: interrupted", file=sys.stderr)
            return 130
    return dispatch(args)


def _fail(message: str, secrets: Sequence[str], code: int = 1) -> int:
    print(f"docoutbox: error: {logs.mask(message, secrets)}", file=sys.stderr)
    return code


def _check(args: argparse.Namespace) -> str | None:
    problem = connection_problem(args)
    if problem is not None:
        return problem
    if not args.db or not args.collection:
        return "--db (--database) and --collection (--container) are required"
    problem = names_problem(args, store_of(args), {"db": "database", "collection": "collection"})
    if problem is not None:
        return problem
    if not args.no_leases:
        try:
            LeaseTiming(ttl=args.lease_ttl)
        except ValueError as exc:
            return str(exc)
    if args.decode:
        try:
            args.decode = stored_values(args.decode)
        except InvalidConfig as exc:
            return str(exc)
    if args.publisher == "kafka" and not args.kafka_bootstrap:
        return "--publisher kafka needs --kafka-bootstrap (or DOCOUTBOX_KAFKA_BOOTSTRAP)"
    if args.publisher != "kafka" and args.topic:
        return "--topic applies to --publisher kafka only"
    if args.publisher == "memory" and not args.discard_entries:
        return (
            "--publisher memory delivers entries nowhere and trims them; it is for demos and "
            "tests only: add --discard-entries to confirm"
        )
    if args.publisher not in ("stdout", "memory", "rabbitmq", "kafka") and not args.broker_url:
        return f"--publisher {args.publisher} needs --broker-url (or DOCOUTBOX_BROKER_URL)"
    if args.publisher == "rabbitmq":
        if not args.rabbitmq_url:
            return "--publisher rabbitmq needs --rabbitmq-url (or DOCOUTBOX_RABBITMQ_URL)"
        problem = _amqp_url_problem(args.rabbitmq_url)
        if problem:
            return f"--rabbitmq-url: {problem}"
    elif args.declare_exchange or args.exchange:
        return "--exchange and --declare-exchange apply to --publisher rabbitmq only"
    return None


def _amqp_url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in {"amqp", "amqps"}:
        return f"expected amqp:// or amqps://, got {logs.mask(url)!r}"
    if not parts.hostname:
        return f"no host in {logs.mask(url)!r}"
    return None


def dispatch(args: argparse.Namespace) -> int:
    secrets = logs.secrets_of(args.mongo_uri) + logs.secrets_of(args.rabbitmq_url)
    secrets += [args.cosmos_key] if args.cosmos_key else []
    logs.configure(args.log_level, secrets=secrets, fmt=args.log_format)
    problem = _check(args)
    if problem:
        return _fail(problem, secrets, code=2)
    # Signals are taken over before connecting, so a stop request during start-up is an
    # orderly stop rather than death by signal.
    stopping = threading.Event()
    running: list[Any] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal_received signal=%s; stopping", signal.Signals(signum).name)
        stopping.set()
        for dispatcher in running:
            dispatcher.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _dispatch(args, secrets, stopping, running)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _store_settings(args: argparse.Namespace) -> StoreSettings:
    """The kit's settings from the command's options (plain values: no adapter reads
    the command line)."""
    kind = store_of(args)
    options: dict[str, str] = {}
    if kind == "cosmos":
        url, key = args.cosmos_endpoint, args.cosmos_key
        if args.cosmos_ca_file:
            options["ca_file"] = args.cosmos_ca_file
        if args.cosmos_insecure:
            options["insecure"] = "1"
    elif kind == "mongo" and not args.store_url:
        url, key = args.mongo_uri, None
    else:
        url, key = args.store_url, os.environ.get("DOCOUTBOX_STORE_KEY")
    if getattr(args, "concurrency", None):
        # The dispatcher's workers: a database client sizes its connection pool to them.
        options["concurrency"] = str(args.concurrency)
    options.update(args.store_option or {})
    return StoreSettings(
        url, args.db, args.collection, key=key, timeout=args.server_timeout, options=options
    )


def _options(args: argparse.Namespace, name: str) -> DispatchOptions:
    return DispatchOptions(
        name=name,
        leases=not args.no_leases,
        lease_ttl=args.lease_ttl,
        partitions=args.partitions,
        concurrency=args.concurrency,
        run_batch=args.run_batch,
        max_attempts=args.max_attempts,
        sweep_interval=args.sweep_interval,
        grace=args.grace,
        poll_interval=args.poll_interval,
        max_stream_wait=args.max_stream_wait,
        checkpoint_interval=args.checkpoint_interval,
        due_interval=args.due_interval,
        codec=None if args.decode is None else args.decode.codec,
        upcasters=None if args.decode is None else args.decode.upcasters,
        trim_delay=args.trim_delay,
        max_untrimmed=args.max_untrimmed,
        claim_check=args.claim_check,
        publish_references=args.publish_references,
    )


def _dispatch(
    args: argparse.Namespace,
    secrets: Sequence[str],
    stopping: threading.Event,
    running: list[Any],
) -> int:
    kind = store_of(args)
    try:
        adapter = registry.store(kind)
    except AdapterMissing as exc:
        return _fail(str(exc), secrets)
    label = adapter.label
    settings = _store_settings(args)
    where = logs.mask(settings.url, secrets)
    if args.cosmos_insecure:
        log.warning(
            "cosmos_tls_unverified endpoint=%s: --cosmos-insecure: the server's certificate "
            "is NOT checked, so anyone on the path can read the key and the data; use it "
            "with a local emulator only, and --cosmos-ca-file anywhere else",
            where,
        )
        # Said once, loudly, here; not once per request.
        logs.quiet_unverified_tls()
    log.debug("connecting %s=%s timeout_s=%s", kind, where, args.server_timeout)
    try:
        kit = adapter.open(settings)
    except DocOutboxError as exc:
        return _fail(f"cannot use {label} at {where}: {_short(exc)}", secrets)
    if stopping.is_set():
        kit.close()
        log.info("stopped_before_start")
        return 0
    try:
        seen = observe.Observability(args, _backlog_probe(kit), _work_probe(kit, args.partitions))
    except (ImportError, ValueError) as exc:
        kit.close()
        return _fail(f"{exc}", secrets, code=2)
    try:
        publisher = _publisher(args)
    except (DocOutboxError, ImportError, ValueError) as exc:
        kit.close()
        return _fail(f"cannot create the {args.publisher} publisher: {_short(exc)}", secrets)
    output = publisher if isinstance(publisher, StdoutPublisher) else None
    if output is not None:

        def reader_gone() -> None:
            log.warning("stdout_closed: nothing more can be delivered; stopping")
            for each in running:
                each.stop()

        output.on_closed = reader_gone
    if args.publisher == "memory":
        log.warning(
            "publisher=memory: entries are trimmed WITHOUT being delivered anywhere "
            "(--discard-entries); never point this at data that matters"
        )
    publisher = seen.publisher(publisher, "rabbitmq" if args.publisher == "rabbitmq" else None)
    name = args.name or f"dispatch:{args.db}.{args.collection}"
    options = _options(args, name)
    polling = args.poll_interval is not None
    log.info(
        "dispatch_starting %s=%s db=%s collection=%s publisher=%s name=%s leases=%s mode=%s",
        kind,
        where,
        args.db,
        args.collection,
        args.publisher,
        name,
        not args.no_leases,
        f"polling every {args.poll_interval}s" if polling else FOLLOWS.get(kind, "change-stream"),
    )
    if args.use_async:
        code = _dispatch_async(
            args, secrets, adapter, settings, kit, publisher, options, seen, running, stopping
        )
        return _closed(output, secrets) if code == 0 else code
    dispatcher = build_dispatcher(kit, publisher, options, metrics=seen.metrics)
    running.append(dispatcher)
    if stopping.is_set():
        dispatcher.stop()
    try:
        seen.start(dispatcher)
    except OSError as exc:
        seen.close()
        kit.close()
        return _fail(f"cannot serve on port {args.metrics_port}: {exc}", secrets)
    if seen.endpoint is not None:
        log.info("endpoint_serving host=%s port=%d", args.metrics_host, seen.endpoint.port)
    try:
        dispatcher.run()
    except PartitionMismatch as exc:
        return _fail(f"refusing to dispatch: {exc}; pass --partitions to match", secrets)
    finally:
        if isinstance(publisher, Closeable):
            publisher.close()
        seen.close()
        kit.close()
    return _closed(output, secrets)


def _closed(output: StdoutPublisher | None, secrets: Sequence[str]) -> int:
    """1 if the dispatcher stopped because its stdout reader went away, else 0."""
    if output is None or output.closed is None:
        return 0
    return _fail(f"stdout was closed ({output.closed}); entries not written stay pending", secrets)


def _dispatch_async(
    args: argparse.Namespace,
    secrets: Sequence[str],
    adapter: StoreAdapter,
    settings: StoreSettings,
    kit: StoreKit,
    publisher: Publisher,
    options: DispatchOptions,
    seen: observe.Observability,
    running: list[Any],
    stopping: threading.Event,
) -> int:
    """The same dispatch on asyncio: the adapter's async kit (pymongo's AsyncMongoClient
    or azure.cosmos.aio), the sync publisher in threads. The sync ``kit`` measures the
    backlog."""

    async def main() -> None:
        ports = await adapter.open_async(settings)
        try:
            dispatcher = build_async_dispatcher(ports, publisher, options, metrics=seen.metrics)
            running[:] = [dispatcher]  # from now on, a signal stops this one
            seen.attach(dispatcher)
            if stopping.is_set():
                dispatcher.stop()
            await dispatcher.run()
        finally:
            await ports.close()

    try:
        seen.start(None)
    except OSError as exc:
        seen.close()
        kit.close()
        return _fail(f"cannot serve on port {args.metrics_port}: {exc}", secrets)
    if seen.endpoint is not None:
        log.info("endpoint_serving host=%s port=%d", args.metrics_host, seen.endpoint.port)
    try:
        asyncio.run(main())
    except PartitionMismatch as exc:
        return _fail(f"refusing to dispatch: {exc}; pass --partitions to match", secrets)
    except DocOutboxError as exc:
        return _fail(f"cannot use {adapter.label}: {_short(exc)}", secrets)
    finally:
        if isinstance(publisher, Closeable):
            publisher.close()
        seen.close()
        kit.close()
    return 0


def _backlog_probe(kit: StoreKit) -> BacklogProbe:
    """The kit's own backlog query where it has one, else a walk through
    ``find_pending``."""
    if isinstance(kit, MeasuredKit):
        return kit.outbox_stats
    return probe_backend(kit.backend)


def _work_probe(kit: StoreKit, partitions: int) -> PendingWorkProbe | None:
    """The kit's pending work per partition (or feed range), where it measures it."""
    if isinstance(kit, PendingWorkKit):
        return lambda: kit.pending_work(partitions)
    return None


def _publisher(args: argparse.Namespace) -> Publisher:
    options = args.broker_option or {}
    if args.publisher in ("memory", "stdout") and options:
        raise InvalidConfig(f"--broker-option has no meaning with --publisher {args.publisher}")
    if args.publisher == "memory":
        return CountingPublisher()
    if args.publisher == "stdout":
        return StdoutPublisher()
    wire = WireFormat(args.wire)
    if args.publisher == "kafka":
        settings = BrokerSettings(
            args.kafka_bootstrap,
            args.topic,
            wire=wire,
            timeout=args.broker_timeout,
            options=options,
        )
    elif args.publisher == "rabbitmq":
        settings = BrokerSettings(
            args.rabbitmq_url,
            args.exchange or None,
            args.routing_key,
            wire=wire,
            timeout=args.broker_timeout,
            declare=args.declare_exchange,
            options=options,
        )
    else:
        settings = BrokerSettings(
            args.broker_url,
            routing_key=args.routing_key,
            wire=wire,
            timeout=args.broker_timeout,
            options=options,
        )
    return registry.broker(args.publisher).publisher(settings)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
