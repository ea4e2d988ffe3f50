"""The claim check: payloads above a size go to a payload store; the entry keeps a reference.

Rules, each kept by one flow of this module (sans-IO, driven sync or async):

1. **Put before commit** (:func:`claim_plan`): the store puts every large payload of a
   commit, whole, before the write that references it. The payload's ID is derived from
   the entry and its content (:func:`payload_id`), so a retried handle puts again
   under the same ID, and no put replaces a payload another entry refers to.
2. **Fresh puts only** (:func:`claim_plan`): a commit never references a put older
   than ``grace * refresh`` seconds: if the puts took longer, they are made again, so
   the orphan sweep (which deletes only puts older than ``grace``) can never remove a
   payload a commit is about to reference.
3. **Never publish an unresolved reference** (:func:`resolve_stored`): the dispatcher
   reads the payload back before it publishes the entry; a missing or partial payload
   raises :class:`~docoutbox.errors.PayloadMissing`, and the entry stays pending.
4. **Delete after the trim** (the dispatch flow): a payload is deleted only after the
   trim that removed its entry has committed.

The threshold applies to the payload's stored form: its encoded text when a codec
encodes it (compressed, encrypted), else its compact JSON, in UTF-8 bytes. What is put is
that stored form, so an encrypted payload is stored encrypted, bound to its entry.

A claim-checked entry's layout is :mod:`docoutbox.stored.reference`'s. Read without
resolving (a reader, or a dispatcher publishing references), its payload is the
reference envelope, which a consumer resolves with
:func:`resolve_reference` or :func:`resolve_reference_async`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from docoutbox.drive import drive, drive_async
from docoutbox.errors import InvalidConfig, InvalidInput, PayloadMissing, TransientStoreError
from docoutbox.ports.payloads import AsyncPayloadStore, PayloadInfo, PayloadStore
from docoutbox.retry import check_seconds
from docoutbox.store.plans import CommitPlan
from docoutbox.stored.codec import Codec
from docoutbox.stored.reference import CLAIM, ENVELOPE, claim_of

#: How many times the puts of one commit are made again before the handle gives up.
MAX_REFRESH = 3


@dataclass(frozen=True)
class ClaimCheck:
    """Move payloads above ``threshold`` bytes (stored form) to ``payloads``.

    ``grace``: seconds a payload stays after its put before the orphan sweep may remove
    it when no pending entry refers to it; ``refresh``: the fraction of ``grace`` a put
    may age before the commit that references it (else it is put again).
    """

    payloads: PayloadStore | AsyncPayloadStore
    threshold: int = 256 * 1024
    grace: float = 3600.0
    refresh: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.payloads, PayloadStore | AsyncPayloadStore):
            raise InvalidConfig(
                "ClaimCheck.payloads must implement docoutbox.ports.payloads.PayloadStore, "
                f"got {type(self.payloads).__name__}"
            )
        if type(self.threshold) is not int or self.threshold < 0:
            raise InvalidConfig(f"ClaimCheck.threshold must be an int >= 0, got {self.threshold!r}")
        check_seconds("ClaimCheck.grace", self.grace, positive=True)
        if not isinstance(self.refresh, int | float) or not 0 < self.refresh < 1:
            raise InvalidConfig(f"ClaimCheck.refresh must be in (0, 1), got {self.refresh!r}")

    @property
    def asynchronous(self) -> bool:
        """Whether :attr:`payloads` is an async payload store."""
        return is_async_store(self.payloads)


def is_async_store(payloads: object) -> bool:
    return inspect.iscoroutinefunction(getattr(payloads, "put", None))


# -- operations on a payload store --------------------------------------------------------


@dataclass(frozen=True)
class PutPayload:
    info: PayloadInfo
    data: bytes


@dataclass(frozen=True)
class GetPayload:
    payload_id: str


@dataclass(frozen=True)
class DeletePayloads:
    payload_ids: tuple[str, ...]


@dataclass(frozen=True)
class FindStale:
    before: datetime
    limit: int


@dataclass(frozen=True)
class DeleteStale:
    info: PayloadInfo


PayloadOp = PutPayload | GetPayload | DeletePayloads | FindStale | DeleteStale


def perform_payload(op: PayloadOp, payloads: PayloadStore | None) -> Any:
    """Carry out ``op`` on a sync payload store."""
    if payloads is None:
        raise PayloadMissing("a claim-checked entry, and no payload store was given")
    if isinstance(op, PutPayload):
        return payloads.put(op.info, op.data)
    if isinstance(op, GetPayload):
        return payloads.get(op.payload_id)
    if isinstance(op, DeletePayloads):
        return payloads.delete(op.payload_ids)
    if isinstance(op, FindStale):
        return payloads.stale(op.before, op.limit)
    return payloads.delete_stale(op.info)


async def perform_payload_async(op: PayloadOp, payloads: AsyncPayloadStore | None) -> Any:
    """The async twin of :func:`perform_payload`."""
    if payloads is None:
        raise PayloadMissing("a claim-checked entry, and no payload store was given")
    if isinstance(op, PutPayload):
        return await payloads.put(op.info, op.data)
    if isinstance(op, GetPayload):
        return await payloads.get(op.payload_id)
    if isinstance(op, DeletePayloads):
        return await payloads.delete(op.payload_ids)
    if isinstance(op, FindStale):
        return await payloads.stale(op.before, op.limit)
    return await payloads.delete_stale(op.info)


# -- references ---------------------------------------------------------------------------


def payload_id(entry: dict[str, Any], data: bytes) -> str:
    """The payload ID of an entry holding ``data``: a digest of its aggregate type and
    ID, its entry ID and the digest of ``data``. The same entry with the same payload
    always gets the same ID (a retried handle puts again in place), while a handler run
    on a stale copy, which may emit the same entry ID (deterministic IDs) with another
    payload, can never overwrite a committed entry's payload."""
    where = f"{entry.get('aggregate_type')}/{entry.get('aggregate_id')!r}/{entry.get('id')}"
    content = hashlib.sha256(data).hexdigest()
    return hashlib.sha256(f"{where}/{content}".encode()).hexdigest()[:40]


def claimed_ids(entries: Collection[object]) -> list[str]:
    """The payload IDs the claim-checked entries among ``entries`` refer to."""
    found = []
    for entry in entries:
        claim = claim_of(entry)
        if claim is not None and isinstance(claim.get("id"), str):
            found.append(claim["id"])
    return found


def stored_form(data: bytes) -> Any:
    """A payload's stored form from the bytes a payload store holds."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadMissing(f"a stored payload is not JSON: {exc}") from exc


# -- rule 1 and 2: put before commit, and fresh -------------------------------------------


def fresh_bound(claim: ClaimCheck) -> float:
    """The most seconds the puts of one commit may take (rule 2): ``grace * refresh``."""
    return claim.grace * claim.refresh


def claim_plan(
    plan: CommitPlan,
    claim: ClaimCheck,
    clock: Callable[[], datetime],
    timer: Callable[[], float],
    rng: random.Random,
) -> Generator[PutPayload, Any, CommitPlan]:
    """``plan`` with its large payloads put and replaced by references (plan unchanged
    when none is large). Puts again while the puts took longer than the fresh bound."""
    large: list[tuple[int, PayloadInfo, bytes]] = []
    for index, entry in enumerate(plan.outbox_push):
        if "payload" not in entry:
            continue
        data = json.dumps(entry["payload"], separators=(",", ":"), ensure_ascii=False).encode()
        if len(data) <= claim.threshold:
            continue
        info = PayloadInfo(
            payload_id(entry, data),
            plan.aggregate_id,
            str(entry["id"]),
            len(data),
            clock(),
            "",
        )
        large.append((index, info, data))
    if not large:
        return plan
    bound = fresh_bound(claim)
    for _ in range(MAX_REFRESH):
        started = timer()
        for _, info, data in large:
            generation = f"{rng.getrandbits(64):016x}"
            yield PutPayload(replace(info, stored_at=clock(), generation=generation), data)
        if timer() - started <= bound:
            break
    else:
        raise TransientStoreError(
            f"the payload store took over {bound:g} s (ClaimCheck.grace * refresh) to store "
            f"{len(large)} payload(s), {MAX_REFRESH} times: nothing was committed"
        )
    pushed = list(plan.outbox_push)
    for index, info, _ in large:
        entry = {k: v for k, v in pushed[index].items() if k != "payload"}
        entry[CLAIM] = {
            "id": info.payload_id,
            "size": info.size,
            "encoded": isinstance(pushed[index]["payload"], str),
        }
        pushed[index] = entry
    return replace(plan, outbox_push=tuple(pushed))


# -- rule 3: resolve before publishing ----------------------------------------------------


def resolve_stored(raw: dict[str, Any]) -> Generator[GetPayload, Any, dict[str, Any]]:
    """``raw`` (a claim-checked stored entry) with its stored payload back in place.

    :class:`~docoutbox.errors.PayloadMissing` if the payload store does not hold it whole
    (its size differs from the reference's)."""
    claim = claim_of(raw)
    assert claim is not None, "not a claim-checked entry"
    pid = claim.get("id")
    if not isinstance(pid, str):
        raise InvalidInput(f"a claim reference without an ID: {claim!r:.80}")
    data = yield GetPayload(pid)
    if not isinstance(data, bytes) or len(data) != claim.get("size"):
        got = len(data) if isinstance(data, bytes) else type(data).__name__
        raise PayloadMissing(
            f"payload {pid} of entry {raw.get('id')!r}: {got} bytes stored, "
            f"{claim.get('size')!r} referenced"
        )
    resolved = {k: v for k, v in raw.items() if k != CLAIM}
    resolved["payload"] = stored_form(data)
    return resolved


def _reference_flow(
    payload: object, codec: Codec | None
) -> Generator[GetPayload, Any, dict[str, Any]]:
    ref = payload.get(ENVELOPE) if isinstance(payload, dict) else None
    if not isinstance(ref, dict) or not isinstance(ref.get("id"), str):
        raise InvalidInput(f"not a claim reference envelope: {payload!r:.80}")
    data = yield GetPayload(ref["id"])
    if not isinstance(data, bytes) or len(data) != ref.get("size"):
        raise PayloadMissing(f"payload {ref['id']} is not stored whole")
    value = stored_form(data)
    if isinstance(value, str):
        if codec is None:
            raise InvalidConfig("this payload is encoded: pass the writer's codec")
        value = codec.decode(value, str(ref.get("context", "")))
    if not isinstance(value, dict):
        raise PayloadMissing(f"payload {ref['id']} is not a JSON object")
    return value


def is_reference(payload: object) -> bool:
    """Whether a published payload is a claim reference envelope."""
    return isinstance(payload, dict) and set(payload) == {ENVELOPE}


def resolve_reference(
    payload: object, payloads: PayloadStore, codec: Codec | None = None
) -> dict[str, Any]:
    """For consumers of published references: the payload an envelope stands for.

    ``codec``: the writer's, when payloads are encoded. Raises
    :class:`~docoutbox.errors.PayloadMissing` if the payload is gone (it is deleted once
    its entry is trimmed: resolve before acknowledging, or keep the grace long enough)."""
    result: dict[str, Any] = drive(
        _reference_flow(payload, codec), lambda op: perform_payload(op, payloads)
    )
    return result


async def resolve_reference_async(
    payload: object, payloads: AsyncPayloadStore, codec: Codec | None = None
) -> dict[str, Any]:
    """The async twin of :func:`resolve_reference`."""

    async def perform(op: PayloadOp) -> Any:
        return await perform_payload_async(op, payloads)

    result: dict[str, Any] = await drive_async(_reference_flow(payload, codec), perform)
    return result
