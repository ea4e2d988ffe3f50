"""Operating commands: ``outbox stats``, ``outbox lag``, ``dead-letters ...`` and
``leases``.

Each works on MongoDB (``--mongo-uri``) or Cosmos DB (``--cosmos-endpoint``), through the
adapter's ``admin`` module.

- ``docoutbox outbox stats``: pending entries and aggregates, the oldest entry's age, per
  partition and per type (``--json`` for machines);
- ``docoutbox outbox lag``: the pending work per partition (MongoDB) or feed range (Cosmos
  DB) in one grouping query, what an autoscaler reads (the KEDA recipe is in its help);
- ``docoutbox dead-letters list | show ID | groups | replay ID... | purge [ID...] --yes``:
  one place for what the dispatcher quarantined and what consumers rejected. ``groups``
  summarizes them by failure fingerprint (error type and normalized message);
  ``replay`` puts a quarantined entry back on its aggregate's outbox (same ``seq``, a new
  ID, never ahead of a later pending entry), or publishes a rejected delivery again to its
  queue, and says which it did; ``replay`` and ``purge`` take ``--group FINGERPRINT``
  instead of IDs;
- ``docoutbox leases``: which instance owns which partition, since when, until when.

Exit codes: 0 done; 1 a server cannot be used, an unknown ID, an aggregate that is gone
(nothing is changed); 2 bad arguments (including ``purge`` without ``--yes``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from docoutbox.dispatch.engine.lag import desired_replicas
from docoutbox.errors import DocOutboxError, InvalidConfig, InvalidInput, NotFound
from docoutbox.store.document import utcnow
from docoutbox.stored.sweep import sweep_orphans
from docoutbox_app import logs
from docoutbox_app.cli.help import Formatter
from docoutbox_app.cli.options import (
    ANY_COLLECTION,
    ANY_DATABASE,
    AT_LEAST_ONE,
    GRACE,
    LIMIT,
    PARTITIONS,
    SERVER_TIMEOUT_HELP,
    STORES,
    TIMEOUT,
    adapter_missing,
    add_cosmos_options,
    connection_problem,
    names_problem,
    store_of,
    stored_values,
)

Runner = Callable[[argparse.Namespace], int]


def _connection(parser: argparse.ArgumentParser, *, collection: bool | None) -> None:
    """The store options, MongoDB's and Cosmos DB's (names are checked once the store is
    known)."""
    env = os.environ.get
    parser.add_argument(
        "--mongo-uri",
        default=env("DOCOUTBOX_MONGO_URI"),
        help="MongoDB URI (or DOCOUTBOX_MONGO_URI, which keeps it out of the process list)",
    )
    add_cosmos_options(parser)
    parser.add_argument(
        "--db", "--database", dest="db", required=True, type=ANY_DATABASE, help="database"
    )
    if collection is not None:
        parser.add_argument(
            "--collection",
            "--container",
            dest="collection",
            required=collection,
            type=ANY_COLLECTION,
            help="the aggregates' collection"
            + ("" if collection else " (replaying outbox entries needs it)"),
        )
    parser.add_argument(
        "--dead-letters",
        default="docoutbox_dead_letters",
        type=ANY_COLLECTION,
        help="dead-letter collection",
    )
    parser.add_argument(
        "--leases", default="docoutbox_leases", type=ANY_COLLECTION, help="lease collection"
    )
    parser.add_argument("--server-timeout", type=TIMEOUT, help=SERVER_TIMEOUT_HELP)
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_commands(sub: Any) -> None:
    """Add ``outbox``, ``dead-letters`` and ``leases`` to the ``docoutbox`` subparsers."""
    outbox = sub.add_parser("outbox", help="inspect the outbox backlog", formatter_class=Formatter)
    osub = outbox.add_subparsers(dest="outbox_command", required=True)
    stats = osub.add_parser(
        "stats",
        help="pending entries and aggregates, oldest age, per partition and type",
        formatter_class=Formatter,
    )
    _connection(stats, collection=True)
    stats.set_defaults(run=_stats)
    lag = osub.add_parser(
        "lag",
        help="pending entries and oldest age per partition or feed range (for autoscaling)",
        description=_LAG,
        formatter_class=Formatter,
    )
    _connection(lag, collection=True)
    lag.add_argument(
        "--partitions",
        type=PARTITIONS,
        help="MongoDB: the stores' partition count (idle partitions then read 0, and it "
        "caps --target-per-replica's answer)",
    )
    lag.add_argument(
        "--by",
        choices=["feed-range", "partition"],
        default="feed-range",
        help="Cosmos DB: group by feed range (as the feed-range leases) or stored partition",
    )
    lag.add_argument(
        "--target-per-replica",
        type=PARTITIONS,
        metavar="N",
        help="also print the replicas wanted: ceil(pending / N), at most one per partition",
    )
    lag.set_defaults(run=_lag)
    sweep = osub.add_parser(
        "sweep-payloads",
        help="delete the claim check's orphaned payloads: put over --grace seconds ago and "
        "referred to by no pending entry and no dead letter (of --dead-letters)",
        formatter_class=Formatter,
    )
    _connection(sweep, collection=True)
    sweep.add_argument(
        "--grace",
        type=GRACE,
        default=3600.0,
        help="seconds; at least the stores' ClaimCheck.grace",
    )
    sweep.add_argument(
        "--limit", type=AT_LEAST_ONE, default=1000, help="payloads looked at per page"
    )
    sweep.set_defaults(run=_sweep_payloads)

    dl = sub.add_parser(
        "dead-letters",
        help="list, show, replay or purge dead letters",
        description=_DEAD_LETTERS,
        formatter_class=Formatter,
    )
    dsub = dl.add_subparsers(dest="dead_letters_command", required=True)
    listing = dsub.add_parser("list", help="dead letters, oldest first", formatter_class=Formatter)
    _connection(listing, collection=None)
    listing.add_argument("--limit", type=LIMIT, default=100, help="at most this many (0: all)")
    listing.set_defaults(run=_list)
    show = dsub.add_parser("show", help="one dead letter in full", formatter_class=Formatter)
    _connection(show, collection=None)
    show.add_argument("id", help="dead letter ID (the entry's ID)")
    show.set_defaults(run=_show)
    groups = dsub.add_parser(
        "groups",
        help="dead letters by failure group (fingerprint), largest first",
        description=_GROUPS,
        formatter_class=Formatter,
    )
    _connection(groups, collection=None)
    groups.set_defaults(run=_groups)
    replay = dsub.add_parser(
        "replay",
        help="put dead letters back on their outbox (or queue)",
        description=_REPLAY,
        formatter_class=Formatter,
    )
    _connection(replay, collection=False)
    replay.add_argument("ids", nargs="*", metavar="ID", help="dead letter IDs")
    replay.add_argument(
        "--group", metavar="FINGERPRINT", help="every dead letter of this failure group"
    )
    replay.add_argument(
        "--rabbitmq-url",
        default=os.environ.get("DOCOUTBOX_RABBITMQ_URL"),
        help="broker for deliveries a consumer rejected (or DOCOUTBOX_RABBITMQ_URL)",
    )
    replay.add_argument(
        "--decode",
        metavar="MODULE:NAME",
        help="the stores' docoutbox.stored.StoredValues (or Codec): replays entries they "
        "encoded, sealed again under the current key",
    )
    replay.set_defaults(run=_replay)
    purge = dsub.add_parser(
        "purge", help="delete dead letters (all, or the IDs given)", formatter_class=Formatter
    )
    _connection(purge, collection=None)
    purge.add_argument("ids", nargs="*", metavar="ID", help="only these (default: all)")
    purge.add_argument(
        "--group", metavar="FINGERPRINT", help="only the dead letters of this failure group"
    )
    purge.add_argument("--yes", action="store_true", help="really delete")
    purge.set_defaults(run=_purge)

    leases = sub.add_parser(
        "leases", help="partition owners, since when", formatter_class=Formatter
    )
    _connection(leases, collection=None)
    leases.add_argument("--group", help="only this lease group (default: every group)")
    leases.set_defaults(run=_leases)


_LAG = """\
Pending entries, the aggregates holding them and the oldest entry's age, per partition
(MongoDB: the stored partition number) or per feed range (Cosmos DB: numbered as the
feed-range leases number them). Every partition has a row; an idle one reads 0.

Cost per run (and per scrape of the dispatcher's metrics, measured every
--backlog-interval): MongoDB, one aggregation over the partial index
docoutbox_pending_partition ({partition: 1}, only documents with pending entries; made
by ensure_indexes), reading as many documents as wait, not the collection. Cosmos DB,
one cross-partition query returning a small row per pending item, plus one read of the
feed ranges.

Autoscaling with KEDA: docoutbox dispatch --metrics-port exports
docoutbox_pending_work_entries{unit,partition} and docoutbox_pending_work_partitions.
Every instance measures the whole collection, so take one series per partition:

  triggers:
  - type: prometheus
    metadata:
      serverAddress: http://prometheus:9090
      query: sum(max by (partition) (docoutbox_pending_work_entries{job="orders-dispatch"}))
      threshold: "1000"          # target pending entries per replica

KEDA then asks for ceil(pending / 1000) replicas; set maxReplicaCount to the partition
count (docoutbox_pending_work_partitions): an instance beyond one per partition holds no
lease. --target-per-replica N prints the same decision."""

_DEAD_LETTERS = """\
One place for the entries the dispatcher quarantined (origin "dispatch") and the
deliveries consumers rejected (origin "consume")."""

_GROUPS = """\
A failure group is every dead letter whose error has the same type and the same message
once the values that vary are replaced (the entry, aggregate and queue names, quoted
values, timestamps, UUIDs, hex values, words with digits, numbers). Each group shows its
fingerprint, count, first and last time seen and the oldest dead letter's ID; give the
fingerprint to replay --group or purge --group."""

_REPLAY = """\
An entry the dispatcher quarantined goes back on its aggregate's outbox with its seq and
a new ID (the old one in the docoutbox-replay-of header; attempts reset). The dispatcher
publishes it before any later entry still pending on that aggregate; receivers with exact
de-duplication see its seq gap filled. A delivery a consumer rejected is published again,
unchanged, to its queue. Every ID is checked first: if one is unknown or its aggregate
is gone, nothing is replayed. --group FINGERPRINT replays the failure group's dead
letters (as listed by groups) instead of named ones."""


def _fail(message: str, secrets: Sequence[str], code: int = 1, limit: int = 500) -> int:
    """One ``docoutbox: error:`` line: driver and validation messages span several."""
    text = " ".join(logs.mask(message, secrets).split())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    print(f"docoutbox: error: {text}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace, body: Callable[[Any, Any], int]) -> int:
    """Connect to the store the arguments name, then ``body(database, admin)``:
    ``database[name]`` is a collection (MongoDB) or a container (Cosmos DB), ``admin``
    the adapter's ``admin`` module."""
    secrets = logs.secrets_of(args.mongo_uri) + logs.secrets_of(getattr(args, "rabbitmq_url", None))
    secrets += [args.cosmos_key] if args.cosmos_key else []
    store = store_of(args)
    problem = _problem(args, store)
    if problem is not None:
        return _fail(problem, secrets, code=2)
    try:
        client, database, admin = _connect(args, store)
    except ImportError as exc:
        return _fail(adapter_missing(store, exc), secrets)
    except DocOutboxError as exc:
        return _fail(f"cannot use {STORES[store][0]}: {exc}", secrets)
    try:
        return body(database, admin)
    except InvalidInput as exc:
        return _fail(str(exc), secrets, code=2)
    except (NotFound, DocOutboxError) as exc:
        return _fail(str(exc), secrets)
    finally:
        client.close()


#: The arguments that name a database or a collection (container).
_NAMES = {"db": "database", "collection": "collection"}
_NAMES |= {"dead_letters": "collection", "leases": "collection"}


def _problem(args: argparse.Namespace, store: str) -> str | None:
    """What is wrong with the store options and names (the store is known by now)."""
    return connection_problem(args) or names_problem(args, store, _NAMES)


def _connect(args: argparse.Namespace, store: str) -> tuple[Any, Any, Any]:
    """The client, the database and the adapter's ``admin`` module of ``store``."""
    if store == "cosmos":
        from docoutbox_cosmos import admin  # type: ignore[import-not-found, unused-ignore]
        from docoutbox_cosmos.clients import (  # type: ignore[import-not-found, unused-ignore]
            tls_options,
        )

        if args.cosmos_insecure:
            # Said by the command's warning; not once per request.
            logs.quiet_unverified_tls()
        client, database = admin.connect_database(
            args.cosmos_endpoint,
            args.cosmos_key,
            args.db,
            timeout=args.server_timeout,
            client_options=tls_options(args.cosmos_ca_file, args.cosmos_insecure),
        )
        return client, database, admin
    from docoutbox_mongo import admin  # type: ignore[import-not-found, unused-ignore, no-redef]
    from docoutbox_mongo.kit import (  # type: ignore[import-not-found, unused-ignore]
        connect_database,
    )

    client, database = connect_database(args.mongo_uri, args.db, timeout=args.server_timeout)
    return client, database, admin


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=_json_default, sort_keys=True))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _stats(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        stats = admin.outbox_stats(database[args.collection])
        if args.json:
            _print_json(stats.to_json())
            return 0
        print(f"collection   {args.db}.{args.collection}")
        print(f"pending      {stats.entries} entries on {stats.aggregates} aggregates")
        oldest = stats.oldest_at.isoformat() if stats.oldest_at else "-"
        print(f"oldest       {stats.oldest_age:.1f} s ({oldest})")
        _table("partition", stats.by_partition)
        _table("type", stats.by_type)
        return 0

    return _run(args, body)


def _sweep_payloads(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        backend, payloads, letters = admin.claim_ports(database, args.collection, args.dead_letters)
        now = utcnow()
        totals = {"deleted": 0, "referenced": 0, "refreshed": 0}
        while True:  # another page while a page deleted all it listed
            report = sweep_orphans(
                backend, payloads, args.grace, dead_letters=letters, limit=args.limit, now=now
            )
            for name in totals:
                totals[name] += len(getattr(report, name))
            if len(report.deleted) < args.limit:
                break
        if args.json:
            _print_json(totals)
        else:
            print(
                f"deleted {totals['deleted']} orphaned payload(s); kept "
                f"{totals['referenced']} referred to, {totals['refreshed']} put again"
            )
        return 0

    return _run(args, body)


def _lag(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        container = database[args.collection]
        if store_of(args) == "cosmos":
            by = "feed_range" if args.by == "feed-range" else "partition"
            work = admin.pending_work(container, by=by, partitions=args.partitions)
        else:
            work = admin.pending_work(container, args.partitions)
        wanted = None
        if args.target_per_replica is not None:
            wanted = desired_replicas(work.entries, args.target_per_replica, work.partitions)
        if args.json:
            _print_json({**work.to_json(), "desired_replicas": wanted})
            return 0
        unit = work.unit.replace("_", " ")
        print(f"collection   {args.db}.{args.collection}")
        print(f"pending      {work.entries} entries on {work.aggregates} aggregates")
        print(f"oldest       {work.oldest_age:.1f} s")
        print(f"\n{unit:<12} {'entries':>8} {'aggregates':>10} {'oldest_s':>10}")
        for key, bucket in sorted(work.by_partition.items()):
            print(
                f"{key:<12} {bucket.entries:>8} {bucket.aggregates:>10} {bucket.oldest_age:>10.1f}"
            )
        if work.unassigned.entries:
            u = work.unassigned
            print(f"{'(none)':<12} {u.entries:>8} {u.aggregates:>10} {u.oldest_age:>10.1f}")
        if wanted is not None:
            print(f"\nreplicas     {wanted} (at {args.target_per_replica} entries per replica)")
        return 0

    return _run(args, body)


def _table(title: str, buckets: dict[Any, Any]) -> None:
    if not buckets:
        return
    print(f"\n{title:<24} {'entries':>8} {'aggregates':>10} {'oldest_s':>10}")
    for key, bucket in sorted(buckets.items(), key=lambda kv: str(kv[0]).zfill(8)):
        print(f"{key!s:<24} {bucket.entries:>8} {bucket.aggregates:>10} {bucket.oldest_age:>10.1f}")


def _dead_letters(args: argparse.Namespace, database: Any, admin: Any) -> Any:
    collection = getattr(args, "collection", None)
    return admin.DeadLetterAdmin(
        database[args.dead_letters],
        database[collection] if collection else None,
        getattr(args, "decode", None),
    )


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    raw = doc.get("entry")
    entry: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return {
        "id": doc.get("_id"),
        "origin": doc.get("origin", "dispatch"),
        "queue": doc.get("queue"),
        "aggregate_id": doc.get("aggregate_id"),
        "type": entry.get("type"),
        "seq": entry.get("seq"),
        "attempts": doc.get("attempts"),
        "quarantined_at": doc.get("quarantined_at"),
        "error": doc.get("error"),
    }


def _list(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        admin = _dead_letters(args, database, admin)
        rows = [_summary(doc) for doc in admin.listing(args.limit)]
        if args.json:
            _print_json(rows)
            return 0
        total = admin.count()
        print(f"{total} dead letter(s)" + (f", showing {len(rows)}" if len(rows) < total else ""))
        for row in rows:
            error = " ".join(str(row["error"]).split())
            where = row["queue"] if row["origin"] == "consume" else row["aggregate_id"]
            print(
                f"{row['id']}  {row['origin']:<8} {where!s:<20} {row['type']!s:<16} "
                f"seq={row['seq']} attempts={row['attempts']} "
                f"at={_json_default(row['quarantined_at'])}  {error[:120]}"
            )
        return 0

    return _run(args, body)


def _show(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        _print_json(_dead_letters(args, database, admin).get(args.id))
        return 0

    return _run(args, body)


def _groups(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        groups = _dead_letters(args, database, admin).groups()
        if args.json:
            _print_json([group.to_json() for group in groups])
            return 0
        total = sum(group.count for group in groups)
        print(f"{total} dead letter(s) in {len(groups)} failure group(s)")
        for group in groups:
            first = _json_default(group.first_seen) if group.first_seen else "-"
            last = _json_default(group.last_seen) if group.last_seen else "-"
            print(
                f"{group.fingerprint}  {group.count:>6}  first={first}  last={last}  "
                f"example={group.example_id}\n    {group.error_type or '-'}: {group.message[:160]}"
            )
        return 0

    return _run(args, body)


def _selection(args: argparse.Namespace) -> str | None:
    """What is wrong with naming IDs and a group together (or neither, for replay)."""
    if args.ids and args.group:
        return "name dead letter IDs or --group, not both (nothing changed)"
    if args.run is _replay and not args.ids and not args.group:
        return "name at least one dead letter ID, or --group FINGERPRINT"
    return None


def _replay(args: argparse.Namespace) -> int:
    problem = _selection(args)
    if problem is None and args.decode:
        try:
            args.decode = stored_values(args.decode)
        except InvalidConfig as exc:
            problem = str(exc)
    if problem is not None:
        return _fail(problem, [], 2)

    def body(database: Any, admin: Any) -> int:
        republish = _republisher(args.rabbitmq_url) if args.rabbitmq_url else None
        dead = _dead_letters(args, database, admin)
        ids = dead.members(args.group) if args.group else args.ids
        done = dead.replay(ids, republish)
        for item in done:
            if args.json:
                continue
            print(f"{item.id}: {item.action} ({item.where})")
        if args.json:
            _print_json([vars(item) for item in done])
        return 0

    return _run(args, body)


def _republisher(url: str) -> Callable[[str, bytes], None]:
    def republish(queue: str, body: bytes) -> None:
        from docoutbox_rabbitmq.replay import (  # type: ignore[import-not-found, unused-ignore]
            publish_body,
        )

        publish_body(url, queue, body)

    return republish


def _purge(args: argparse.Namespace) -> int:
    problem = _selection(args)
    if problem is not None:
        return _fail(problem, [], 2)
    if not args.yes:
        what = f"{len(args.ids)} dead letter(s)" if args.ids else "every dead letter"
        what = f"failure group {args.group}" if args.group else what
        return _fail(f"purge deletes {what}; add --yes to confirm (nothing deleted)", [], 2)

    def body(database: Any, admin: Any) -> int:
        dead = _dead_letters(args, database, admin)
        count = dead.purge(dead.members(args.group) if args.group else args.ids)
        print(f"purged {count} dead letter(s)")
        return 0

    return _run(args, body)


def _leases(args: argparse.Namespace) -> int:
    def body(database: Any, admin: Any) -> int:
        rows = admin.lease_rows(database[args.leases], args.group)
        if args.json:
            _print_json([row.to_json() for row in rows])
            return 0
        if not rows:
            print("no leases")
            return 0
        print(f"{'group':<20} {'partition':>9}  {'owner':<48} {'since':<32} expires")
        for row in rows:
            part = "member" if row.partition is None else str(row.partition)
            since = _json_default(row.since) if row.since else "-"
            until = _json_default(row.expires_at) if row.expires_at else "-"
            print(
                f"{row.group:<20} {part:>9}  {row.owner:<48} {since:<32} {until}"
                + ("  (expired)" if row.expired else "")
            )
        return 0

    return _run(args, body)
