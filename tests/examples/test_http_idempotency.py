"""The idempotent HTTP service over the wire server, behind a proxy that loses requests and
responses: each key changes the balance exactly once, and every retry gets the first
response."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvicorn
from pymongo import MongoClient

from docoutbox import Message
from docoutbox.testing import MemoryBackend
from docoutbox_mongo import MongoBackend
from examples.http_idempotency.app import (
    KEY_TTL,
    MAX_KEYS,
    create_app,
    fingerprint,
    handlers,
    open_store,
)
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.wire

Reply = tuple[int, dict[str, Any], dict[str, str]]


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


class Service:
    """The app on uvicorn in a thread, reached through a fault-injecting proxy."""

    def __init__(self, store: Any, clock: Clock) -> None:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(store, clock=clock), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        self.proxy = TcpProxy(("127.0.0.1", self.port))
        self.attempts = 0

    def close(self) -> None:
        self.proxy.close()
        self.server.should_exit = True
        self.thread.join(10)

    def request(self, method: str, path: str, body: Any = None, key: str | None = None) -> Reply:
        """One attempt; raises OSError or HTTPException when the connection is lost."""
        self.attempts += 1
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy.port, timeout=10)
        try:
            headers = {"Content-Type": "application/json"}
            if key is not None:
                headers["Idempotency-Key"] = key
            payload = None if body is None else json.dumps(body)
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = json.loads(response.read() or b"{}")
            return response.status, data, dict(response.getheaders())
        finally:
            conn.close()

    def retrying(
        self, path: str, body: Any, key: str, fault: Callable[[], None] | None = None
    ) -> tuple[Reply, int]:
        """POST until an answer arrives; ``fault`` arms the proxy before each attempt."""
        for attempt in range(1, 20):
            if fault is not None:
                fault()
            try:
                return self.request("POST", path, body, key), attempt
            except (OSError, http.client.HTTPException):
                time.sleep(0.01)
        raise AssertionError("no answer after 20 attempts")

    def balance(self, account: str) -> int:
        status, body, _ = self.request("GET", f"/accounts/{account}")
        assert status == 200, body
        return int(body["balance"])


@pytest.fixture
def store(mongo_uri: str) -> Iterator[Any]:

    client: Any = MongoClient(mongo_uri, uuidRepresentation="standard")
    name = f"idem_{uuid.uuid4().hex[:10]}"
    yield open_store(MongoBackend(client["docoutbox_test"][name]))
    client["docoutbox_test"].drop_collection(name)
    client.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(store: Any, clock: Clock) -> Iterator[Service]:
    svc = Service(store, clock)
    yield svc
    svc.close()


def test_a_lost_response_is_answered_again_on_retry(service: Service) -> None:
    (status, body, headers), attempts = service.retrying(
        "/accounts/a1/deposits", {"amount": 10}, "k1", fault=_once(service.proxy.drop_next_reply)
    )
    assert attempts == 2  # the first response was lost after the deposit was made
    assert (status, body) == (200, {"balance": 10})
    assert headers.get("idempotent-replayed") == "true"
    again, _ = service.retrying("/accounts/a1/deposits", {"amount": 10}, "k1")
    assert again[:2] == (200, {"balance": 10})
    assert service.balance("a1") == 10


def test_every_key_changes_the_balance_exactly_once(service: Service) -> None:
    rng = random.Random(7)
    proxy = service.proxy

    def chaos() -> None:
        roll = rng.random()
        if roll < 0.4:
            proxy.drop_next_reply()
        elif roll < 0.55:
            proxy.drop_on_next_send()

    first: dict[str, Reply] = {}
    expected = 0
    for index in range(30):
        key = f"key-{index}"
        amount = rng.randint(1, 50)
        reply, _ = service.retrying("/accounts/a2/deposits", {"amount": amount}, key, chaos)
        expected += amount
        assert reply[0] == 200 and reply[1]["balance"] == expected, (key, reply)
        first[key] = reply
    # Every key again, in another order: the same status and body, nothing changes.
    for key in rng.sample(sorted(first), len(first)):
        index = int(key.split("-")[1])
        rng_amount = _amount_of(first, key, index)
        reply, _ = service.retrying("/accounts/a2/deposits", {"amount": rng_amount}, key, chaos)
        assert reply[:2] == first[key][:2]
    assert service.balance("a2") == expected
    assert service.attempts > 60  # faults did happen: more attempts than requests


def _amount_of(first: dict[str, Reply], key: str, index: int) -> int:
    before = first[f"key-{index - 1}"][1]["balance"] if index else 0
    return int(first[key][1]["balance"]) - int(before)


def test_a_key_reused_with_another_body_is_refused(service: Service) -> None:
    ok, _ = service.retrying("/accounts/a3/deposits", {"amount": 5}, "k")
    assert ok[0] == 200
    other, _ = service.retrying("/accounts/a3/deposits", {"amount": 6}, "k")
    assert other[0] == 422
    elsewhere, _ = service.retrying("/accounts/a3/withdrawals", {"amount": 5}, "k")
    assert elsewhere[0] == 422
    assert service.balance("a3") == 5


def test_a_refusal_is_replayed_too(service: Service) -> None:
    refused, _ = service.retrying("/accounts/a4/withdrawals", {"amount": 5}, "w1")
    assert refused[:2] == (409, {"error": "insufficient funds", "balance": 0})
    service.retrying("/accounts/a4/deposits", {"amount": 50}, "d1")
    again, _ = service.retrying("/accounts/a4/withdrawals", {"amount": 5}, "w1")
    assert again[:2] == refused[:2]  # the first answer, not a new decision
    assert service.balance("a4") == 50


def test_bad_requests(service: Service) -> None:
    assert service.request("POST", "/accounts/a5/deposits", {"amount": 5})[0] == 400
    assert service.request("POST", "/accounts/a5/deposits", {"amount": -1}, "k")[0] == 400
    assert service.request("POST", "/accounts/a5/deposits", {"amount": 1}, "x" * 300)[0] == 400


def test_an_expired_key_is_not_processed_again(service: Service, clock: Clock) -> None:
    service.retrying("/accounts/a6/deposits", {"amount": 5}, "old")
    clock.now += KEY_TTL + timedelta(minutes=1)
    service.retrying("/accounts/a6/deposits", {"amount": 1}, "new")  # prunes "old"
    late, _ = service.retrying("/accounts/a6/deposits", {"amount": 5}, "old")
    assert late[0] == 409 and "expired" in late[1]["error"]
    assert service.balance("a6") == 6


def test_stored_responses_are_bounded() -> None:
    store = open_store(MemoryBackend())
    at = datetime.now(UTC)
    for index in range(MAX_KEYS + 50):
        key = f"k{index}"
        payload = {"amount": 1, "key": key, "fingerprint": fingerprint("POST", "/", {})}
        payload["at"] = (at + timedelta(seconds=index)).isoformat()
        store.handle("a", Message(id=key, type="Deposit", payload=payload), handlers, create=True)
    snapshot = store.get("a")
    assert snapshot.state.balance == MAX_KEYS + 50
    assert len(snapshot.state.responses) == MAX_KEYS
    assert len(snapshot.inbox) == MAX_KEYS
    assert min(snapshot.state.responses, key=lambda k: int(k[1:])) == "k50"


def _once(action: Callable[[], None]) -> Callable[[], None]:
    done = [False]

    def arm() -> None:
        if not done[0]:
            done[0] = True
            action()

    return arm
