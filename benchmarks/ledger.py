"""A receiving workload: a ledger per producer that records every ``seq`` it applied.

Applying a message twice, losing one or applying one out of order all show in its
``seqs``; the Kafka consumer benchmark and the end-to-end tests read them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from pydantic import Field

from docoutbox.handlers import Handlers
from docoutbox.model import Aggregate, AggregateId, Message, OutboxMessage
from docoutbox.store.document import utcnow


class Ledger(Aggregate):
    """A receiver that records, per source, the ``seq`` of every message it applied, in order.

    Applying a message twice, losing one or applying out of order all show in ``seqs``.
    """

    seqs: dict[str, list[int]] = Field(default_factory=dict)
    total: int = 0


ledger_handlers: Handlers[Ledger] = Handlers()


@ledger_handlers.on("Added", "Event")
def record(state: Ledger, message: Message) -> Ledger:
    assert message.source is not None and message.seq is not None
    seqs = {**state.seqs, message.source: [*state.seqs.get(message.source, []), message.seq]}
    amount = message.payload.get("n", 1)
    assert isinstance(amount, int)
    return state.model_copy(update={"seqs": seqs, "total": state.total + amount})


def by_source(message: Message) -> AggregateId:
    """Receive each producer's stream on its own ledger."""
    assert message.source is not None
    return message.source


def make_entry(
    aggregate_id: AggregateId = "p1",
    seq: int = 1,
    *,
    type: str = "Event",
    n: int = 1,
    id: str | None = None,
    **fields: Any,
) -> OutboxMessage:
    """An outbox entry as a producer's store would have sealed it."""
    return OutboxMessage(
        id=id or f"e-{aggregate_id}-{seq}-{uuid.uuid4().hex[:8]}",
        type=type,
        payload={"n": n},
        created_at=utcnow() - timedelta(seconds=1),
        seq=seq,
        aggregate_id=aggregate_id,
        aggregate_type="Producer",
        **fields,
    )
