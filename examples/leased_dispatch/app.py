"""A leased dispatcher on MongoDB or Cosmos DB, built with the composition root's one call,
exactly as ``docoutbox dispatch`` builds it.

Run several copies against one collection: they share its partitions through leases, and
when one stops (or dies), the others take its partitions over within one lease TTL::

    python -m examples.leased_dispatch.app mongo mongodb://localhost:27017 bank accounts
    COSMOS_KEY=... python -m examples.leased_dispatch.app cosmos https://ACCOUNT:443/ bank accounts

Entries are written to stdout as JSON lines (replace the publisher with
``docoutbox_rabbitmq.RabbitPublisher`` or ``docoutbox_kafka.KafkaPublisher``). SIGTERM
stops it: in-flight work finishes, the checkpoint is saved, the leases are released.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from docoutbox import Dispatcher, OutboxMessage
from docoutbox.codec import encode_entry
from docoutbox.ports.dispatch import Publisher
from docoutbox.ports.kit import StoreKit
from docoutbox_app import DispatchOptions, build_dispatcher
from docoutbox_cosmos import open_kit as open_cosmos_kit
from docoutbox_mongo import open_kit as open_mongo_kit


class StdoutPublisher:
    """Each entry as one JSON line (the broker body)."""

    def publish(self, entry: OutboxMessage) -> None:
        sys.stdout.write(encode_entry(entry).decode() + "\n")
        sys.stdout.flush()


def mongo_kit(uri: str, database: str, collection: str) -> StoreKit:
    return open_mongo_kit(uri, database, collection)


def cosmos_kit(endpoint: str, key: str, database: str, container: str, **client: Any) -> StoreKit:
    return open_cosmos_kit(endpoint, key, database, container, client_options=client)


def leased_dispatcher(
    kit: StoreKit, publisher: Publisher, name: str, *, lease_ttl: float = 10.0
) -> Dispatcher:
    """The one call: a dispatcher that shares ``kit``'s collection with other instances."""
    return build_dispatcher(kit, publisher, DispatchOptions(name=name, lease_ttl=lease_ttl))


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("mongo", "cosmos"):
        print(__doc__, file=sys.stderr)
        return 2
    store, url, database, collection = argv
    if store == "mongo":
        kit = mongo_kit(url, database, collection)
    else:
        kit = cosmos_kit(url, os.environ["COSMOS_KEY"], database, collection)
    dispatcher = leased_dispatcher(kit, StdoutPublisher(), f"example:{database}.{collection}")
    signal.signal(signal.SIGTERM, lambda signum, frame: dispatcher.stop())
    try:
        dispatcher.run()
    finally:
        kit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
