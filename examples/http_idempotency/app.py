"""Idempotent HTTP requests: a retried request with the same ``Idempotency-Key`` is
processed once and answered with the first attempt's response, even if that response was
lost on the way back.

::

    POST /accounts/{account_id}/deposits      {"amount": 10}    Idempotency-Key: <key>
    POST /accounts/{account_id}/withdrawals   {"amount": 10}    Idempotency-Key: <key>
    GET  /accounts/{account_id}

How: the request becomes a docoutbox message whose ID is the key. Its handler computes the
response (200 with the new balance, or 409 for insufficient funds) and stores it in the
account's document, next to the balance, in the same conditional write; the inbox makes a
second handling impossible. A retry finds the stored response and gets it back verbatim
(with ``Idempotent-Replayed: true``).

Rules:

- keys are scoped to one account; a key is honoured for :data:`KEY_TTL` after its first
  use, and for the last :data:`MAX_KEYS` keys of the account, whichever ends first;
- the same key with a different request (method, path or body) gets 422, never the
  first response;
- a key past its lifetime is refused with 409 while the inbox still remembers it (the
  request may have been processed: it is not processed again), and treated as a new key
  after that. Clients must not retry a request for longer than :data:`KEY_TTL`.

What is stored per account is bounded: at most :data:`MAX_KEYS` responses (a few hundred
bytes each) and an inbox of the same size.

Run against MongoDB:  python -m examples.http_idempotency.app mongodb://localhost:27017/
Run in memory:        python -m examples.http_idempotency.app
"""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from docoutbox import Aggregate, AggregateStore, Handlers, InboxPolicy, Message, StoreConfig
from docoutbox.ports.store import StoreBackend
from docoutbox.testing import MemoryBackend

KEY_TTL = timedelta(hours=24)
MAX_KEYS = 200
MAX_KEY_LENGTH = 255


class Stored(BaseModel):
    """A response as first sent, and what identifies the request it answered."""

    status: int
    body: dict[str, Any]
    fingerprint: str
    at: datetime


class Account(Aggregate):
    aggregate_type: ClassVar[str] = "Account"

    balance: int = 0
    responses: dict[str, Stored] = Field(default_factory=dict)


handlers: Handlers[Account] = Handlers()


def _remember(account: Account, message: Message, status: int, body: dict[str, Any]) -> Account:
    """Record the response under the key; drop keys past their lifetime or over the bound."""
    at = datetime.fromisoformat(str(message.payload["at"]))
    kept = {key: stored for key, stored in account.responses.items() if at - stored.at < KEY_TTL}
    kept[str(message.payload["key"])] = Stored(
        status=status, body=body, fingerprint=str(message.payload["fingerprint"]), at=at
    )
    newest = sorted(kept.items(), key=lambda item: item[1].at)[-MAX_KEYS:]
    balance = body.get("balance", account.balance)
    assert isinstance(balance, int)
    return account.model_copy(update={"balance": balance, "responses": dict(newest)})


def _amount(message: Message) -> int:
    amount = message.payload.get("amount")
    assert isinstance(amount, int)
    return amount


@handlers.on("Deposit")
def deposit(account: Account, message: Message) -> Account:
    balance = account.balance + _amount(message)
    return _remember(account, message, 200, {"balance": balance})


@handlers.on("Withdraw")
def withdraw(account: Account, message: Message) -> Account:
    amount = _amount(message)
    if amount > account.balance:
        body = {"error": "insufficient funds", "balance": account.balance}
        return _remember(account, message, 409, body)
    return _remember(account, message, 200, {"balance": account.balance - amount})


def config() -> StoreConfig:
    # The inbox remembers as many keys as the account keeps responses for.
    return StoreConfig(inbox=InboxPolicy(window=MAX_KEYS))


def fingerprint(method: str, path: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([method, path, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _replay(stored: Stored, key: str, replayed: bool) -> JSONResponse:
    headers = {"Idempotency-Key": key}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(stored.body, status_code=stored.status, headers=headers)


def create_app(store: AggregateStore[Account], *, clock: Any = None) -> Starlette:
    """The service over ``store``. ``clock`` (for tests) returns the current UTC time."""
    now = clock or (lambda: datetime.now(UTC))

    def answer(account_id: str, key: str, fp: str) -> JSONResponse | None:
        snapshot = store.load(account_id)
        stored = None if snapshot is None else snapshot.state.responses.get(key)
        if stored is None:
            return None
        if stored.fingerprint != fp:
            return _error(422, "Idempotency-Key was used for a different request")
        return _replay(stored, key, replayed=True)

    async def command(request: Request) -> JSONResponse:
        key = request.headers.get("Idempotency-Key", "")
        if not key or len(key) > MAX_KEY_LENGTH:
            return _error(400, f"an Idempotency-Key of 1-{MAX_KEY_LENGTH} characters is required")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body must be JSON")
        amount = body.get("amount") if isinstance(body, dict) else None
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            return _error(400, "amount must be a positive integer")
        account_id = request.path_params["account_id"]
        kind = "Deposit" if request.url.path.endswith("/deposits") else "Withdraw"
        fp = fingerprint(request.method, request.url.path, body)
        # Store calls block (a sync driver): run them off the event loop.
        replay = await run_in_threadpool(answer, account_id, key, fp)
        if replay is not None:
            return replay
        message = Message(
            id=f"idem:{key}",
            type=kind,
            payload={"amount": amount, "key": key, "fingerprint": fp, "at": now().isoformat()},
        )
        outcome = await run_in_threadpool(store.handle, account_id, message, handlers, create=True)
        if outcome.applied:
            assert outcome.state is not None
            return _replay(outcome.state.responses[key], key, replayed=False)
        if outcome.duplicate:
            # A concurrent attempt with this key won the race, or the key has expired.
            replay = await run_in_threadpool(answer, account_id, key, fp)
            if replay is not None:
                return replay
            return _error(409, "Idempotency-Key has expired; use a new key")
        return _error(503, "the account is too busy, retry with the same key")

    async def show(request: Request) -> JSONResponse:
        snapshot = await run_in_threadpool(store.load, request.path_params["account_id"])
        if snapshot is None:
            return _error(404, "no such account")
        return JSONResponse({"balance": snapshot.state.balance})

    return Starlette(
        routes=[
            Route("/accounts/{account_id}/deposits", command, methods=["POST"]),
            Route("/accounts/{account_id}/withdrawals", command, methods=["POST"]),
            Route("/accounts/{account_id}", show, methods=["GET"]),
        ]
    )


def open_store(backend: StoreBackend) -> AggregateStore[Account]:
    return AggregateStore(backend, Account, config())


def main(argv: list[str]) -> None:  # pragma: no cover - manual entry point
    import uvicorn

    if len(argv) > 1:
        from pymongo import MongoClient

        from docoutbox_mongo import MongoBackend

        db: Any = MongoClient(argv[1], serverSelectionTimeoutMS=5000)["payments"]
        backend: StoreBackend = MongoBackend(db["accounts"])
    else:
        backend = MemoryBackend()
    uvicorn.run(create_app(open_store(backend)), host="127.0.0.1", port=8000)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv)
