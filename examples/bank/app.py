"""The bank service: handles commands on accounts, then relays their outbox to the ledger.

Run against MongoDB:   python -m examples.bank.app mongodb://localhost:27017/ [DATABASE]
Run on Cosmos DB:      COSMOS_ENDPOINT=... COSMOS_KEY=... python -m examples.bank.app cosmos [DB]
Run in memory:         python -m examples.bank.app
"""

from __future__ import annotations

import os
import sys
from typing import Any

from docoutbox import AggregateStore, InboxPolicy, Message, StoreConfig
from docoutbox.testing import MemoryBackend
from examples.bank.model import Account, Ledger, handlers, ledger_handlers


def stores(
    uri: str | None, database: str = "bank"
) -> tuple[AggregateStore[Account], AggregateStore[Ledger]]:
    if uri is None:
        return AggregateStore(MemoryBackend(), Account), _ledger(MemoryBackend())
    if uri == "cosmos":
        return cosmos_stores(database)
    from pymongo import MongoClient

    from docoutbox_mongo import MongoBackend

    db: Any = MongoClient(uri, serverSelectionTimeoutMS=5000)[database]
    accounts = AggregateStore(MongoBackend(db["accounts"]), Account)
    ledger = _ledger(MongoBackend(db["ledger"]))
    accounts.ensure_indexes()
    ledger.ensure_indexes()
    return accounts, ledger


def cosmos_stores(database: str) -> tuple[AggregateStore[Account], AggregateStore[Ledger]]:
    from azure.cosmos import PartitionKey

    from docoutbox_cosmos import CosmosBackend
    from docoutbox_cosmos.clients import open_client

    client = open_client(os.environ["COSMOS_ENDPOINT"], os.environ["COSMOS_KEY"])
    db = client.create_database_if_not_exists(database)
    by_id = PartitionKey(path="/id")
    accounts = AggregateStore(
        CosmosBackend(db.create_container_if_not_exists("accounts", by_id)), Account
    )
    ledger = _ledger(CosmosBackend(db.create_container_if_not_exists("ledger", by_id)))
    return accounts, ledger


def _ledger(backend: Any) -> AggregateStore[Ledger]:
    # The ledger de-duplicates exactly, by (source, seq), whatever the window.
    return AggregateStore(backend, Ledger, StoreConfig(inbox=InboxPolicy(exact=True)))


def relay(accounts: AggregateStore[Account], ledger: AggregateStore[Ledger]) -> int:
    """Deliver every pending entry to the ledger, then trim it. Returns how many."""
    delivered = 0
    for snapshot in accounts.pending():
        for entry in snapshot.outbox:
            ledger.handle("main", entry.to_message(), ledger_handlers, create=True)
            delivered += 1
        accounts.trim(snapshot.aggregate_id, [e.id for e in snapshot.outbox])
    return delivered


def main(argv: list[str]) -> int:
    accounts, ledger = stores(*argv[:2]) if argv else stores(None)
    accounts.create("alice", Account(owner="Alice"))
    commands = [
        Message(id="cmd-1", type="Deposit", payload={"amount": 100}),
        Message(id="cmd-2", type="Withdraw", payload={"amount": 30}),
        Message(id="cmd-2", type="Withdraw", payload={"amount": 30}),  # redelivered
        Message(id="cmd-3", type="Withdraw", payload={"amount": 500}),
    ]
    for command in commands:
        outcome = accounts.handle("alice", command, handlers)
        print(f"{command.id} {command.type}: {outcome.status}")
    print(f"relayed {relay(accounts, ledger)} messages; again: {relay(accounts, ledger)}")
    print(f"alice: {accounts.get('alice').state}")
    print(f"ledger: {ledger.get('main').state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
