"""One publish round on the publisher's own connection (:mod:`~docoutbox_rabbitmq.link`):
frames written once, settled by the broker's confirms, with no future or task per entry.

Rule (I4 under nacks): the round's entries are written in order, in one write, before
any confirm is awaited, and each gets its own outcome: None once the broker acks it,
else the error ``publish`` would raise for it (a nack or a ``mandatory`` return fails
that entry only). A round holds at most one entry per aggregate, and the engine
republishes an aggregate's run from its first failed entry, so per-aggregate
first-delivery order holds whatever the broker confirms later. A channel or connection
that closes with entries unconfirmed fails each of them with its translated error
(``BrokerUnavailable`` for a lost connection); an entry still unconfirmed ``timeout``
seconds after the round began (waiting while the broker blocks the connection counts)
fails with ``BrokerUnavailable`` too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from docoutbox.errors import BrokerUnavailable, DocOutboxError
from docoutbox_rabbitmq import frames
from docoutbox_rabbitmq.errors import connection_failed
from docoutbox_rabbitmq.link import Link, Round


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One entry ready to send: its routing key (an AMQP short string), encoded
    properties, body, message id and the description its errors carry."""

    key: bytes
    props: bytes
    body: bytes
    message_id: str
    what: str


def message_id_of(fields: dict[str, Any]) -> str:
    """The message id a returned message is matched by; one is made if ``fields`` lack it,
    and written into ``fields``."""
    message_id = fields.get("message_id")
    if not message_id:
        message_id = fields["message_id"] = uuid.uuid4().hex
    return str(message_id)


async def publish_round(
    link: Link,
    exchange: str,
    mandatory: bool,
    sends: Sequence[tuple[int, Outgoing]],
    outcomes: list[Exception | None],
    timeout: float,
) -> None:
    """Send ``sends`` (index into ``outcomes``, entry) on ``link`` in one write and
    settle their ``outcomes`` from the broker's confirms, within ``timeout`` seconds."""
    if not sends:
        return
    try:
        target = frames.short_string(exchange, "exchange")
    except DocOutboxError as exc:  # nothing is sent: every entry's outcome
        for index, _ in sends:
            outcomes[index] = exc
        return
    whats = [""] * len(outcomes)
    for index, out in sends:
        whats[index] = out.what
    round_ = Round(outcomes, whats, link.loop.create_future())
    for index, _ in sends:
        round_.expect(index)
    try:
        async with asyncio.timeout(timeout):
            await link.ready()
            # Nothing awaits from here to the write: the channel and its size hold.
            number, size = link.channel, link.max_content
            payload = b"".join(
                frames.publish(number, target, out.key, mandatory, out.props, out.body, size)
                for _, out in sends
            )
            link.send(payload, round_, [(i, out.message_id, out.key[1:]) for i, out in sends])
            await round_.done
    except TimeoutError:
        round_.fail_unsettled(connection_failed, TimeoutError(f"no confirm within {timeout} s"))
    except asyncio.CancelledError as exc:
        round_.fail_unsettled(_cancelled, exc)
        raise
    except BrokerUnavailable as exc:  # the link was lost before the write
        round_.fail_unsettled(connection_failed, exc)


def _cancelled(_: BaseException, what: str) -> DocOutboxError:
    return BrokerUnavailable(f"{what}: the round was cancelled before its confirms")
