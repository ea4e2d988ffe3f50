"""What the sync and the ``azure.cosmos.aio`` Cosmos DB benchmarks share: the account, the
request meters, the raw loops' write, the backlog and the drain table.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from azure.cosmos import PartitionKey

from benchmarks.common import Scale, Table, median, paired_ratio, ratio_range
from benchmarks.servers import (
    CosmosAccount,
    CosmosServer,
    cosmos_account_from_env,
    cosmos_server_available,
)
from benchmarks.workload import Account, Doc, account_ids
from docoutbox import AggregateStore
from docoutbox.store.document import new_document
from docoutbox_cosmos import CosmosBackend
from docoutbox_cosmos.items import ItemCodec, format_time


@contextlib.contextmanager
def cosmos_account() -> Iterator[CosmosAccount]:
    account = cosmos_account_from_env()
    if account is not None:
        yield account
        return
    reason = cosmos_server_available()
    if reason is not None:
        raise SystemExit(f"Cosmos DB server unavailable: {reason}")
    with CosmosServer() as server:
        yield server.account()


@dataclass
class Meter:
    """Counts HTTP responses (round trips) and their request charge, thread-safely."""

    responses: int = 0
    charge: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, response: Any) -> None:
        headers = response.http_response.headers
        with self.lock:
            self.responses += 1
            self.charge += float(headers.get("x-ms-request-charge") or 0.0)

    def on_charge(self, _kind: str, _status: int, charge: float) -> None:
        with self.lock:
            self.responses += 1
            self.charge += charge

    def snapshot(self) -> tuple[int, float]:
        with self.lock:
            return self.responses, self.charge


class FeedCounter:
    """A container whose change-feed responses (pages, and 304s) are counted on a meter;
    everything else goes to the container itself."""

    def __init__(self, container: Any, meter: Meter) -> None:
        self._container = container
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)

    def query_items_change_feed(self, **kwargs: Any) -> Any:
        hook = kwargs.get("response_hook")

        def counted(headers: Any, result: Any) -> None:
            with self._meter.lock:
                self._meter.responses += 1
                self._meter.charge += float(headers.get("x-ms-request-charge") or 0.0)
            if hook is not None:
                hook(headers, result)

        return self._container.query_items_change_feed(**{**kwargs, "response_hook": counted})


def new_container(database: Any, prefix: str) -> Any:
    return database.create_container(f"{prefix}_{uuid.uuid4().hex[:8]}", PartitionKey("/id"))


def deposit(item: Doc, message: Doc, window: int) -> tuple[Doc, list[str], str]:
    """The raw loops' state change: the new state, the inbox window and the time."""
    state = item["state"]
    new = {"balance": state["balance"] + message["payload"]["n"]}
    new["deposits"] = state["deposits"] + 1
    inbox = [*item["inbox"], message["id"]][-window:]
    return new, inbox, format_time(datetime.now(UTC))


def guarded_patch(item: Doc, new: Doc, inbox: list[str], now: str) -> dict[str, Any]:
    """``patch_item`` arguments of docoutbox's commit, guarded by the item's version."""
    ops = [
        {"op": "set", "path": "/state", "value": new},
        {"op": "incr", "path": "/version", "value": 1},
        {"op": "set", "path": "/outbox_seq", "value": item["outbox_seq"]},
        {"op": "set", "path": "/updated_at", "value": now},
        {"op": "set", "path": "/inbox", "value": inbox},
    ]
    predicate = f"FROM c WHERE c.version = {int(item['version'])}"
    return {"patch_operations": ops, "filter_predicate": predicate}


def make_accounts(database: Any, prefix: str, scale: Scale) -> tuple[Any, list[str]]:
    container = new_container(database, prefix)
    accounts = account_ids(scale.aggregates)
    setup = AggregateStore(CosmosBackend(container), Account)
    for account in accounts:
        setup.create(account, Account())
    return container, accounts


def paired_cell(samples: dict[str, list[float]], name: str, base: str) -> str:
    low, high = ratio_range(samples[name], samples[base])
    return f"{paired_ratio(samples[name], samples[base]):.2f}x ({low:.2f}-{high:.2f})"


#: The handle benchmark's own scale: more, shorter rounds than the other benchmarks'.
HANDLE_SCALE = {"messages": 100, "rounds": 30}


def handle_scale(scale: Scale) -> Scale:
    """The handle benchmark's scale for a run at ``scale``: a quick run stays quick."""
    return scale if scale == Scale.quick() else replace(scale, **HANDLE_SCALE)


class CountingPublisher:
    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def publish(self, entry: Any) -> None:
        with self._lock:
            self.count += 1


def fill(container: Any, docs: int, per_doc: int, threads: int = 8) -> None:
    """``docs`` aggregates with ``per_doc`` pending entries each, written in parallel."""
    codec = ItemCodec()
    now = datetime.now(UTC)

    def item(index: int) -> Doc:
        aggregate_id = f"acc-{index:07d}"
        doc = new_document(aggregate_id, "Account", {"balance": 0, "deposits": 0}, 0, now)
        doc["outbox"] = [
            {
                "id": str(uuid.uuid4()),
                "type": "Deposited",
                "payload": {"n": seq},
                "headers": {},
                "created_at": now,
                "seq": seq,
                "aggregate_id": aggregate_id,
                "aggregate_type": "Account",
                "correlation_id": None,
                "causation_id": None,
                "destination": None,
                "attempts": 0,
                "last_error": None,
            }
            for seq in range(1, per_doc + 1)
        ]
        doc["outbox_seq"] = per_doc
        return codec.to_item(doc)

    def work(start: int) -> None:
        for index in range(start, docs, threads):
            container.create_item(item(index))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


def drain_table(
    key: str,
    title: str,
    readers: tuple[str, str],
    entries: int,
    raw: tuple[Sequence[float], Sequence[float]],
    dispatch: tuple[Sequence[float], Sequence[float]],
) -> Table:
    """A drain benchmark's table: the raw read's and the dispatcher's rates and requests
    per round (warm-up left out), as medians, with the paired ratio and its range."""
    (raw_rates, raw_trips), (dispatch_rates, dispatch_trips) = raw, dispatch
    raw_req, dispatch_req = median(raw_trips), median(dispatch_trips)
    raw_label, dispatch_label = readers
    table = Table(
        key,
        title,
        ["reader", "entries/s", f"vs {raw_label}", "requests", "entries / request"],
    )
    table.add(
        f"{raw_label} (all feed ranges)", median(raw_rates), "1.00x", raw_req, entries / raw_req
    )
    ratio = paired_ratio(dispatch_rates, raw_rates)
    low, high = ratio_range(dispatch_rates, raw_rates)
    table.add(
        f"{dispatch_label} (concurrency 8)",
        median(dispatch_rates),
        f"{ratio:.2f}x ({low:.2f}-{high:.2f})",
        dispatch_req,
        entries / dispatch_req,
    )
    table.figures = {
        "raw_per_s": median(raw_rates),
        "dispatcher_per_s": median(dispatch_rates),
        "vs_raw": ratio,
        "vs_raw_iqr": [low, high],
        "raw_requests": raw_req,
        "dispatcher_requests": dispatch_req,
        "entries_per_request_raw": entries / raw_req,
        "entries_per_request_dispatcher": entries / dispatch_req,
        "rounds": len(raw_rates),
    }
    return table
