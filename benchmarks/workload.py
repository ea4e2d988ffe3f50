"""The business workload every benchmark runs, as docoutbox and as hand-written baselines.

An ``Account`` aggregate takes ``Deposit`` messages. The docoutbox handler and the raw
pymongo loops make the same state change on the same document layout, so a ratio
between them is the cost of the library, not of a different workload.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from pymongo.errors import DuplicateKeyError

from benchmarks.common import new_collection
from docoutbox import Aggregate, AggregateStore, Decision, Handlers, Message, StoreConfig, emit
from docoutbox_mongo import MongoBackend

Doc = dict[str, Any]


class Account(Aggregate):
    aggregate_type: ClassVar[str] = "Account"

    balance: int = 0
    deposits: int = 0


handlers: Handlers[Account] = Handlers()


@handlers.on("Deposit")
def deposit(state: Account, message: Message) -> Decision[Account]:
    n = message.payload["n"]
    assert isinstance(n, int)
    new = state.model_copy(update={"balance": state.balance + n, "deposits": state.deposits + 1})
    if message.payload.get("emit"):
        return Decision(new, emit("Deposited", {"n": n, "balance": new.balance}))
    return Decision(new)


def account_ids(count: int) -> list[str]:
    return [f"acc-{index:05d}" for index in range(count)]


class Feed:
    """Deposit messages for a set of accounts, round-robin, with fresh IDs.

    With ``sources`` > 0 every message also carries ``source``/``seq``: each account
    hears from ``sources`` producers, each stream numbered without gaps from ``first_seq``.
    """

    def __init__(
        self, accounts: list[str], *, emit: bool, sources: int = 0, first_seq: int = 1
    ) -> None:
        self.accounts = accounts
        self.emit = emit
        self.sources = sources
        self._turn = 0
        self._seq: dict[tuple[str, int], int] = {}
        self._first = first_seq

    def take(self, count: int) -> list[tuple[str, Doc]]:
        batch = []
        for _ in range(count):
            account = self.accounts[self._turn % len(self.accounts)]
            message: Doc = {
                "id": str(uuid.uuid4()),
                "type": "Deposit",
                "payload": {"n": 1, "emit": self.emit},
            }
            if self.sources:
                source = (self._turn // len(self.accounts)) % self.sources
                seq = self._seq.get((account, source), self._first)
                self._seq[account, source] = seq + 1
                message["source"] = f"Producer/{source}"
                message["seq"] = seq
            self._turn += 1
            batch.append((account, message))
        return batch


def make_store(collection: Any, config: StoreConfig | None = None) -> AggregateStore[Account]:
    return AggregateStore(MongoBackend(collection), Account, config)


def create_accounts(collection: Any, accounts: list[str]) -> None:
    setup = make_store(collection)
    for account in accounts:
        setup.create(account, Account())


def prefill(collection: Any, accounts: list[str], *, window: int, sources: int, hw: int) -> None:
    """Bring every account's inbox to its steady-state size before measuring."""
    for account in accounts:
        update: Doc = {"inbox": [str(uuid.uuid4()) for _ in range(window)]}
        if sources:
            update["inbox_marks"] = [
                {"source": f"Producer/{s}", "hw": hw, "above": []} for s in range(sources)
            ]
        collection.update_one({"_id": account}, {"$set": update})


class RawLoop:
    """The same update written directly with pymongo: find, then one guarded update.

    ``cached`` keeps the last written document per account, like docoutbox's cache, so
    a commit is the update alone.
    """

    def __init__(self, collection: Any, *, window: int, cached: bool = False) -> None:
        self.collection = collection
        self.window = window
        self.cached = cached
        self._docs: dict[str, Doc] = {}

    def handle(self, account: str, message: Doc) -> None:
        doc = self._docs.pop(account, None)
        while True:
            if doc is None:
                doc = self.collection.find_one({"_id": account})
                assert doc is not None
            if message["id"] in doc["inbox"]:
                return
            state = doc["state"]
            new = {"balance": state["balance"] + message["payload"]["n"]}
            new["deposits"] = state["deposits"] + 1
            update: Doc = {
                "$set": {
                    "state": new,
                    "outbox_seq": doc["outbox_seq"],
                    "updated_at": datetime.now(UTC),
                },
                "$inc": {"version": 1},
            }
            if self.window:
                update["$push"] = {"inbox": {"$each": [message["id"]], "$slice": -self.window}}
            query = {"_id": account, "version": doc["version"]}
            if self.collection.update_one(query, update).matched_count:
                if self.cached:
                    doc["state"], doc["version"] = new, doc["version"] + 1
                    if self.window:
                        doc["inbox"] = [*doc["inbox"], message["id"]][-self.window :]
                    self._docs[account] = doc
                return
            doc = None


class Classic:
    """The classic pattern without transactions, as frameworks do it on document stores.

    Aggregates, outbox entries and processed-message markers live in three collections:
    insert the marker (a duplicate key means "already processed"), load the aggregate,
    update it guarded by ``version``, insert the outbox entry. Four round trips; three
    with ``processed=False``. Without a transaction a crash between the writes loses or
    duplicates effects; docoutbox exists to avoid exactly that.
    """

    def __init__(self, client: Any, prefix: str, *, processed: bool) -> None:
        self.aggregates = new_collection(client, f"{prefix}_aggregates")
        self.outbox = new_collection(client, f"{prefix}_outbox")
        self.processed = new_collection(client, f"{prefix}_processed") if processed else None

    def seed(self, accounts: list[str]) -> None:
        now = datetime.now(UTC)
        self.aggregates.insert_many(
            [
                {"_id": a, "version": 0, "state": {"balance": 0, "deposits": 0}, "updated_at": now}
                for a in accounts
            ]
        )

    def handle(self, account: str, message: Doc) -> None:
        if self.processed is not None:
            try:
                self.processed.insert_one({"_id": message["id"], "at": datetime.now(UTC)})
            except DuplicateKeyError:
                return
        while True:
            doc = self.aggregates.find_one({"_id": account})
            assert doc is not None
            state = doc["state"]
            n = message["payload"]["n"]
            new = {"balance": state["balance"] + n, "deposits": state["deposits"] + 1}
            now = datetime.now(UTC)
            update = {"$set": {"state": new, "updated_at": now}, "$inc": {"version": 1}}
            query = {"_id": account, "version": doc["version"]}
            if self.aggregates.update_one(query, update).matched_count:
                break
        if message["payload"].get("emit"):
            self.outbox.insert_one(classic_entry(account, doc["version"] + 1, message, new, now))

    def clear_outbox(self) -> None:
        self.outbox.delete_many({})


def classic_entry(account: str, seq: int, cause: Doc, state: Doc, now: datetime) -> Doc:
    entry_id = str(uuid.uuid4())
    return {
        "_id": entry_id,
        "id": entry_id,
        "type": "Deposited",
        "payload": {"n": cause["payload"]["n"], "balance": state["balance"]},
        "headers": {},
        "created_at": now,
        "seq": seq,
        "aggregate_id": account,
        "aggregate_type": "Account",
        "correlation_id": cause["id"],
        "causation_id": cause["id"],
        "destination": None,
    }
