"""The Cosmos DB kit: everything a dispatcher needs from one account, opened from plain
arguments (:func:`open_kit`; :func:`~docoutbox_cosmos.aio.open_async_kit` on
``azure.cosmos.aio``), and :data:`STORE`, the adapter the ``docoutbox.stores`` entry
point names."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from docoutbox.dispatch.engine.lag import PendingWork
from docoutbox.ports.kit import StoreSettings, name_problem
from docoutbox_cosmos.admin import FeedRanges, pending_work
from docoutbox_cosmos.aio import AsyncCosmosKit, open_async_kit
from docoutbox_cosmos.archive import archive_name, ensure_archive
from docoutbox_cosmos.backend import ChargeHook, CosmosBackend
from docoutbox_cosmos.changes import CosmosChangeSource
from docoutbox_cosmos.clients import (
    base_options,
    coordination_container,
    open_client,
    pool_size,
    pooled_transport,
    tls_options,
)
from docoutbox_cosmos.coordination import CosmosCheckpoints, CosmosDeadLetters
from docoutbox_cosmos.existence import require_container
from docoutbox_cosmos.leases import CosmosFeedRangeLeases
from docoutbox_cosmos.payloads import (
    CosmosPayloads,
    create_payloads_container,
    payloads_container,
)


@dataclass
class CosmosKit:
    """A :class:`~docoutbox.ports.kit.StoreKit` on one container. ``source`` and
    ``checkpoints`` serve a single instance (every feed range, one checkpoint item);
    instances that share the container take theirs from the feed-range leases
    (:meth:`~docoutbox_cosmos.leases.CosmosFeedRangeLeases.leased_ports`)."""

    client: Any
    backend: CosmosBackend
    source: CosmosChangeSource
    checkpoints: CosmosCheckpoints
    leases: CosmosFeedRangeLeases
    dead_letters: CosmosDeadLetters
    _ranges: FeedRanges | None = field(default=None, repr=False)

    @cached_property
    def payloads(self) -> CosmosPayloads:
        """The claim check's payload store: the side container ``<container>_payloads``,
        created when missing (:class:`~docoutbox.ports.payloads.PayloadKit`)."""
        coll = self.backend.container
        database = self.client.get_database_client(coll.container_link.split("/")[1])
        return CosmosPayloads(create_payloads_container(database, payloads_container(coll.id)))

    def pending_work(self, partitions: int | None = None) -> PendingWork:
        """Pending entries per feed range, numbered as the leases number them
        (:func:`~docoutbox_cosmos.admin.pending_work`; ``partitions`` is not needed)."""
        if self._ranges is None:
            self._ranges = FeedRanges(self.backend.container)
        return pending_work(self.backend.container, ranges=self._ranges, codec=self.backend.codec)

    def close(self) -> None:
        self.leases.close()
        self.client.close()


def open_kit(
    endpoint: str,
    key: str,
    database: str,
    container: str,
    *,
    timeout: float | None = None,
    checkpoints: str = "docoutbox_checkpoints",
    leases: str = "docoutbox_leases",
    dead_letters: str = "docoutbox_dead_letters",
    group: str | None = None,
    partition_key_path: str = "/id",
    on_charge: ChargeHook | None = None,
    client_options: dict[str, Any] | None = None,
    inbox_archive: str | None = None,
) -> CosmosKit:
    """Open a client, check the aggregates' container exists, and create the
    coordination containers when missing.

    ``inbox_archive``: the container of a spilling inbox's archive
    (:mod:`docoutbox_cosmos.archive`, e.g. ``archive_name(container)``), created when
    missing; None: the backend has no archive (``InboxPolicy(spill=True)`` is refused).

    Raises :class:`~docoutbox.errors.StoreError` for a bad endpoint or key, an unreachable
    account, or a missing database or container.
    """
    client = open_client(endpoint, key, **{**base_options(timeout), **(client_options or {})})
    try:
        db = client.get_database_client(database)
        coll = db.get_container_client(container)
        require_container(coll)
        archive = None if inbox_archive is None else ensure_archive(db, inbox_archive)
        backend = CosmosBackend(
            coll,
            partition_key_path=partition_key_path,
            on_charge=on_charge,
            inbox_archive=archive,
        )
        lease_table = CosmosFeedRangeLeases(
            coordination_container(db, leases), coll, group or container, codec=backend.codec
        )
        return CosmosKit(
            client=client,
            backend=backend,
            source=CosmosChangeSource(coll, codec=backend.codec),
            checkpoints=CosmosCheckpoints(coordination_container(db, checkpoints)),
            leases=lease_table,
            dead_letters=CosmosDeadLetters(coordination_container(db, dead_letters)),
        )
    except BaseException:
        client.close()
        raise


def settings_options(settings: StoreSettings, *, pooled: bool = True) -> dict[str, Any]:
    """Client options from a kit's settings: ``ca_file`` (a PEM file to trust) or
    ``insecure`` ("1": no certificate check, local emulators only), see
    :func:`~docoutbox_cosmos.clients.tls_options`; ``concurrency``, the dispatcher's
    workers, sizes a sync client's connection pool (``pooled``;
    :func:`~docoutbox_cosmos.clients.pool_size`)."""
    insecure = settings.options.get("insecure", "") in ("1", "true", "yes")
    options = tls_options(settings.options.get("ca_file") or None, insecure)
    concurrency = settings.options.get("concurrency")
    if concurrency and pooled:
        options["transport"] = pooled_transport(pool_size(int(concurrency)))
    return options


def archive_option(settings: StoreSettings) -> str | None:
    """The archive container a kit opens for a spilling inbox: option ``inbox_archive``,
    "1" (or "true", "yes") for ``<container>.inbox``, or a container's name; None
    without it."""
    value = settings.options.get("inbox_archive", "")
    if not value or value in ("0", "false", "no"):
        return None
    return archive_name(settings.collection) if value in ("1", "true", "yes") else value


class CosmosStore:
    """The Cosmos DB adapter (:class:`~docoutbox.ports.kit.StoreAdapter`).

    :class:`~docoutbox.ports.kit.StoreSettings`: ``url`` is the account endpoint, ``key``
    the account key; options ``ca_file`` and ``insecure`` as :func:`settings_options`.
    """

    label = "Cosmos DB"
    extra = "cosmos"

    def open(self, settings: StoreSettings) -> CosmosKit:
        return open_kit(
            settings.url,
            settings.key or "",
            settings.database,
            settings.collection,
            timeout=settings.timeout,
            client_options=settings_options(settings),
            inbox_archive=archive_option(settings),
        )

    async def open_async(self, settings: StoreSettings) -> AsyncCosmosKit:
        return await open_async_kit(
            settings.url,
            settings.key or "",
            settings.database,
            settings.collection,
            timeout=settings.timeout,
            client_options=settings_options(settings, pooled=False),
            inbox_archive=archive_option(settings),
        )

    def name_problem(self, text: str, what: str) -> str | None:
        """Why ``text`` cannot name a Cosmos DB ``what``: resource IDs have 1-255
        characters, none of / \\ # ?, and no trailing space."""
        return name_problem(text, what, "/\\#?", reserved=len(text) > 255 or text.endswith(" "))


#: The adapter the ``docoutbox.stores`` entry point ``cosmos`` names.
STORE = CosmosStore()
