"""``docoutbox demo``: wallets credited concurrently, with redelivered commands; the
dispatcher publishes their outboxes to a broker that delivers some messages twice; a
statement consumer applies each message exactly once. Prints what happened and checks it.

In memory by default; ``--mongo-uri`` runs it on MongoDB (change streams).
"""

from __future__ import annotations

import argparse
import queue
import random
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from pydantic import BaseModel, PositiveInt

from docoutbox import Aggregate, AggregateStore, Decision, Handlers, InboxPolicy, Message, emit
from docoutbox.dispatch.drivers.threads import Dispatcher, DispatcherConfig
from docoutbox.errors import DocOutboxError, InvalidInput
from docoutbox.model import OutboxMessage
from docoutbox.retry import RetryPolicy
from docoutbox.store.core import StoreConfig
from docoutbox.testing import MemoryBackend, MemoryDeadLetters
from docoutbox_app import logs
from docoutbox_app.cli.help import Formatter
from docoutbox_app.cli.options import DATABASE, TIMEOUT, Parser, number


class Wallet(Aggregate):
    balance: int = 0


class Statement(Aggregate):
    credited: int = 0
    lines: int = 0


class Credit(BaseModel):
    amount: PositiveInt
    wallet: str


wallet_handlers: Handlers[Wallet] = Handlers()
statement_handlers: Handlers[Statement] = Handlers()


@wallet_handlers.on("Credit")
def credit(wallet: Wallet, message: Message) -> Decision[Wallet]:
    body = message.payload_as(Credit)
    new = wallet.model_copy(update={"balance": wallet.balance + body.amount})
    return Decision(new, emit("Credited", body, destination="statements"))


@statement_handlers.on("Credited")
def record(statement: Statement, message: Message) -> Statement:
    body = message.payload_as(Credit)
    return statement.model_copy(
        update={"credited": statement.credited + body.amount, "lines": statement.lines + 1}
    )


@dataclass
class Broker:
    """An at-least-once broker: every publish is delivered, some of them twice."""

    rng: random.Random
    duplicate_rate: float
    deliveries: queue.Queue[OutboxMessage] = field(default_factory=queue.Queue)
    published: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, entry: OutboxMessage) -> None:
        with self.lock:
            self.published.add(entry.id)
            twice = self.rng.random() < self.duplicate_rate
        self.deliveries.put(entry)
        if twice:
            self.deliveries.put(entry)


#: Wallets, and credits per wallet: at least one, and at most this many commands in all.
MAX_COMMANDS = 1_000_000
COUNT = number(int, 1, high=MAX_COMMANDS)
#: A share of commands or deliveries, from none (0) to all (1).
SHARE = number(float, 0, high=1)


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="docoutbox demo", description=__doc__.replace("``", ""), formatter_class=Formatter
    )
    p.add_argument("--mongo-uri", help="run on MongoDB (a replica set or the test wire server)")
    p.add_argument("--wallets", type=COUNT, default=20)
    p.add_argument("--credits", type=COUNT, default=25, help="credit commands per wallet")
    p.add_argument("--redeliver", type=SHARE, default=0.2, help="share of commands sent twice")
    p.add_argument("--duplicate", type=SHARE, default=0.2, help="share of deliveries doubled")
    p.add_argument("--seed", type=number(int, 0, high=2**63 - 1), default=7)
    p.add_argument("--timeout", type=TIMEOUT, default=120.0)
    p.add_argument(
        "--db", type=DATABASE, help="MongoDB database to use (default: a new random name)"
    )
    p.add_argument("--keep", action="store_true", help="keep the MongoDB database afterwards")
    return p


def _stores(
    uri: str | None, name: str | None = None, keep: bool = False
) -> tuple[Any, Any, Any, Any]:
    """(wallet backend, statement backend, change source or None, closer)."""
    if uri is None:
        return MemoryBackend(), MemoryBackend(), None, lambda: None
    from docoutbox_mongo import MongoBackend  # noqa: PLC0415
    from docoutbox_mongo.errors import translated  # noqa: PLC0415
    from docoutbox_mongo.kit import open_kit  # noqa: PLC0415

    db = name or f"docoutbox_demo_{uuid.uuid4().hex[:8]}"
    target = open_kit(uri, db, "wallets")
    try:
        with translated():
            existing = target.client[db].list_collection_names()
    except BaseException:
        target.close()
        raise
    if existing:
        target.close()
        # The demo writes its own wallets and drops its database at the end: never
        # someone else's data.
        raise InvalidInput(
            f"database {db!r} already holds collections ({', '.join(sorted(existing)[:5])}); "
            "the demo needs a new or empty database"
        )
    statements = MongoBackend(target.client[db]["statements"])

    def close() -> None:
        if not keep:
            target.client.drop_database(db)
        target.close()

    return target.backend, statements, target.source, close


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.wallets * args.credits > MAX_COMMANDS:
        parser.error(f"--wallets x --credits must be at most {MAX_COMMANDS} commands")
    # SIGTERM stops the demo as Ctrl-C does: the dispatcher stops, the database it
    # created is dropped (unless --keep), and it exits 130 without a traceback.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("docoutbox: demo interrupted (nothing was checked)", file=sys.stderr)
        return 130
    except InvalidInput as exc:
        print(f"docoutbox: error: --db: {exc}", file=sys.stderr)
        return 2
    except DocOutboxError as exc:
        where = f" at {args.mongo_uri}" if args.mongo_uri else ""
        text = " ".join(f"cannot use MongoDB{where}: {exc}".split())
        text = logs.mask(text[:400], logs.secrets_of(args.mongo_uri))
        print(f"docoutbox: error: {text}", file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    wallet_backend, statement_backend, source, close = _stores(args.mongo_uri, args.db, args.keep)
    patient = StoreConfig(retry=RetryPolicy(max_attempts=1000, max_delay=0.05))
    wallets = AggregateStore(wallet_backend, Wallet, patient)
    statements = AggregateStore(
        statement_backend, Statement, StoreConfig(inbox=InboxPolicy(exact=True))
    )
    broker = Broker(rng, args.duplicate)
    config = DispatcherConfig(name="demo", sweep_interval=0.5, grace=0.0, poll_interval=0.01)
    dispatcher = Dispatcher(
        wallet_backend, broker, MemoryDeadLetters(), source=source, config=config
    )
    runner = threading.Thread(target=dispatcher.run, name="dispatcher")
    started = time.monotonic()
    counts = {"applied": 0, "duplicate": 0, "consumed": 0, "deduplicated": 0}
    try:
        runner.start()
        dispatcher.started.wait(30)
        commands = [
            (
                f"wallet-{w}",
                Message(
                    id=f"credit-{w}-{c}",
                    type="Credit",
                    payload={"amount": rng.randint(1, 100), "wallet": f"wallet-{w}"},
                ),
            )
            for w in range(args.wallets)
            for c in range(args.credits)
        ]
        commands += rng.sample(commands, int(len(commands) * args.redeliver))
        rng.shuffle(commands)
        for wallet_id, command in commands:
            outcome = wallets.handle(wallet_id, command, wallet_handlers, create=True)
            counts[outcome.status.value] += 1
        expected = counts["applied"]
        deadline = started + args.timeout
        while time.monotonic() < deadline and (
            counts["consumed"] < expected or next(iter(wallets.pending()), None) is not None
        ):
            try:
                entry = broker.deliveries.get(timeout=0.05)
            except queue.Empty:
                continue
            _consume(statements, entry, counts)
        while not broker.deliveries.empty():
            _consume(statements, broker.deliveries.get(), counts)
        return _report(args, wallets, statements, broker, counts, time.monotonic() - started)
    finally:
        dispatcher.stop()
        if runner.is_alive():
            runner.join()
        close()


def _consume(
    statements: AggregateStore[Statement], entry: OutboxMessage, counts: dict[str, int]
) -> None:
    statement_id = f"statement-{entry.payload['wallet']}"
    result = statements.handle(statement_id, entry.to_message(), statement_handlers, create=True)
    counts["consumed" if result.applied else "deduplicated"] += 1


def _report(
    args: argparse.Namespace,
    wallets: AggregateStore[Wallet],
    statements: AggregateStore[Statement],
    broker: Broker,
    counts: dict[str, int],
    elapsed: float,
) -> int:
    problems = []
    pending = sum(1 for _ in wallets.pending())
    for w in range(args.wallets):
        wallet = wallets.load(f"wallet-{w}")
        balance = wallet.state.balance if wallet is not None else 0
        statement = statements.load(f"statement-wallet-{w}")
        credited = statement.state.credited if statement is not None else 0
        if credited != balance:
            problems.append(f"wallet-{w}: balance {balance} but statement {credited}")
    if counts["consumed"] != counts["applied"]:
        problems.append(f"{counts['applied']} credits applied, {counts['consumed']} consumed")
    if pending:
        problems.append(f"{pending} wallets still have pending outbox entries")
    print(f"store:       {'mongodb' if args.mongo_uri else 'in memory'}")
    print(
        f"commands:    {counts['applied']} applied, {counts['duplicate']} redelivered "
        "(recognized by the inbox)"
    )
    print(f"dispatcher:  {len(broker.published)} messages published, outboxes empty: {not pending}")
    print(
        f"consumer:    {counts['consumed']} applied, {counts['deduplicated']} duplicate "
        "deliveries skipped"
    )
    print(f"elapsed:     {elapsed:.2f}s")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("exactly once: " + ("yes" if not problems else "NO"))
    return 0 if not problems else 1
