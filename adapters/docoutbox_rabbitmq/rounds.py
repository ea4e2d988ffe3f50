"""One publish round on aiormq's confirm-mode channel: frames written once, settled by
the broker's confirms, with no future or task per entry.

Rule (I4 under nacks): the round's entries are written in order, in one write, before
any confirm is awaited, and each gets its own outcome: None once the broker acks it,
else the error ``publish`` would raise for it (a nack or a ``mandatory`` return fails
that entry only). The engine republishes an aggregate's run from its first failed entry,
so per-aggregate first-delivery order holds whatever the broker confirms later. A
channel or connection that closes with entries unconfirmed fails each of them with its
translated error (``BrokerUnavailable`` for a lost connection); an entry still
unconfirmed ``timeout`` seconds after the round began fails with the timeout's error.

How: the round takes consecutive delivery tags under aiormq's channel lock (the counter
aiormq's own ``basic_publish`` uses, so both may share the channel) and puts a
:class:`Slot` in the channel's ``confirmations`` for each: aiormq's reader settles it
from ``basic.ack`` / ``basic.nack`` (``multiple`` too) and ``basic.return`` (by message
id) as it settles its own publishes, calling the future methods a slot provides. The
round waits on one future of the channel's, which aiormq fails when the channel or its
connection closes. The connection's handshake, heartbeats, TLS, ``connection.blocked``
and close stay aiormq's: the frames go through its connection's write queue.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, cast

from aiormq.abc import ChannelFrame

from docoutbox.errors import DocOutboxError, InvalidConfig
from docoutbox_rabbitmq import frames


class ConfirmChannel(Protocol):
    """What a round uses of an open ``aiormq.Channel`` in confirm mode."""

    number: int
    max_content_size: int
    delivery_tag: int
    confirmations: dict[int, Any]
    message_id_delivery_tag: dict[str, int]
    write_queue: asyncio.Queue[Any]

    @property
    def lock(self) -> AbstractAsyncContextManager[None]: ...

    def create_future(self) -> asyncio.Future[Any]: ...


#: What a round reads and writes of aiormq's channel; not a public API of aiormq, so the
#: ``rabbitmq-aio`` extra pins the aiormq releases these were checked against.
_CHANNEL_PARTS = (
    "number",
    "max_content_size",
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "lock",
    "create_future",
)


def confirm_channel(channel: object) -> ConfirmChannel:
    """``channel`` (an open ``aiormq.Channel`` in confirm mode) as a round uses it, or
    :class:`~docoutbox.errors.InvalidConfig` naming what this aiormq lacks: a round never
    starts on a channel it cannot settle."""
    missing = [part for part in _CHANNEL_PARTS if not hasattr(channel, part)]
    if missing or not isinstance(getattr(channel, "confirmations", None), dict):
        raise InvalidConfig(
            f"this aiormq release's channel lacks {', '.join(missing) or 'confirmations'}: "
            "install the aiormq releases the rabbitmq-aio extra names"
        )
    return cast(ConfirmChannel, channel)


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
    """The message id a returned message is matched by; one is made if ``fields`` lack it
    (as aiormq does), and written into ``fields``."""
    message_id = fields.get("message_id")
    if not message_id:
        message_id = fields["message_id"] = uuid.uuid4().hex
    return str(message_id)


#: Translates a channel's or broker's error into the entry's docoutbox error.
Translate = Callable[[BaseException, str], DocOutboxError]


class Round:
    """The outcomes of one round, settled entry by entry; ``done`` resolves once every
    entry is settled."""

    __slots__ = ("done", "left", "outcomes", "settled", "translate")

    def __init__(
        self, outcomes: list[Exception | None], done: asyncio.Future[Any], translate: Translate
    ) -> None:
        self.outcomes = outcomes
        self.settled = [True] * len(outcomes)
        self.left = 0
        self.done = done
        self.translate = translate

    def expect(self, index: int) -> None:
        self.settled[index] = False
        self.left += 1

    def settle(self, index: int, outcome: Exception | None) -> None:
        if self.settled[index]:
            return
        self.settled[index] = True
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)

    def fail_unsettled(self, error: BaseException, whats: Sequence[str]) -> None:
        """Settle every entry still waiting with ``error``, translated for each."""
        for index, settled in enumerate(self.settled):
            if not settled:
                failure = self.translate(error, whats[index])
                failure.__cause__ = error
                self.settle(index, failure)


class Slot:
    """One entry's place in aiormq's ``confirmations``: the methods of a confirm future
    that aiormq's reader calls, settling the entry in its round."""

    __slots__ = ("channel", "index", "message_id", "round", "tag", "what")

    def __init__(
        self,
        round_: Round,
        index: int,
        channel: ConfirmChannel,
        tag: int,
        message_id: str,
        what: str,
    ) -> None:
        self.round = round_
        self.index = index
        self.channel = channel
        self.tag = tag
        self.message_id = message_id
        self.what = what

    def done(self) -> bool:
        return self.round.settled[self.index]

    def cancelled(self) -> bool:
        """A settled slot counts as cancelled: aiormq then ignores a late confirm quietly."""
        return self.round.settled[self.index]

    def set_result(self, _: object) -> None:
        self.forget()
        self.round.settle(self.index, None)

    def set_exception(self, exc: BaseException) -> None:
        self.forget()
        if not self.done():
            failure = self.round.translate(exc, self.what)
            failure.__cause__ = exc
            self.round.settle(self.index, failure)

    def forget(self) -> None:
        """Drop this entry's message id from the channel's map of returns to tags (aiormq
        does not call a settled slot again, and a late return then finds nothing)."""
        ids = self.channel.message_id_delivery_tag
        if ids.get(self.message_id) == self.tag:
            del ids[self.message_id]


async def publish_round(
    channel: ConfirmChannel,
    exchange: str,
    mandatory: bool,
    sends: Sequence[tuple[int, Outgoing]],
    outcomes: list[Exception | None],
    timeout: float,
    translate: Translate,
) -> None:
    """Send ``sends`` (index into ``outcomes``, entry) on ``channel`` in one write and
    settle their ``outcomes`` from the broker's confirms, within ``timeout`` seconds."""
    if not sends:
        return
    number, size = channel.number, channel.max_content_size
    try:
        target = frames.short_string(exchange, "exchange")
    except DocOutboxError as exc:  # nothing is sent: every entry's outcome
        for index, _ in sends:
            outcomes[index] = exc
        return
    payload = b"".join(
        frames.publish(number, target, out.key, mandatory, out.props, out.body, size)
        for _, out in sends
    )
    whats = [""] * len(outcomes)
    for index, out in sends:
        whats[index] = out.what
    round_ = Round(outcomes, channel.create_future(), translate)
    for index, _ in sends:
        round_.expect(index)
    slots: list[Slot] = []
    try:
        async with asyncio.timeout(timeout):
            async with channel.lock:
                await channel.write_queue.put(ChannelFrame(payload=payload, should_close=False))
                # Nothing awaits from here to the last slot: no confirm can come first.
                tag = channel.delivery_tag
                channel.delivery_tag = tag + len(sends)
                confirmations, ids = channel.confirmations, channel.message_id_delivery_tag
                for index, out in sends:
                    tag += 1
                    slot = Slot(round_, index, channel, tag, out.message_id, out.what)
                    confirmations[tag] = slot
                    ids[out.message_id] = tag
                    slots.append(slot)
            await round_.done
    except TimeoutError:
        expire(round_, slots, TimeoutError(f"no confirm within {timeout} s"), whats)
    except asyncio.CancelledError:
        expire(round_, slots, TimeoutError("the round was cancelled"), whats)
        raise
    except Exception as exc:  # noqa: BLE001 - the channel's close reason: each entry's outcome
        expire(round_, slots, exc, whats)


def expire(
    round_: Round, slots: Sequence[Slot], error: BaseException, whats: Sequence[str]
) -> None:
    """Fail every unsettled entry of ``round_`` with ``error``, and forget the message ids
    of its slots: aiormq ignores a settled slot's late confirm, and a late return then
    finds no tag."""
    round_.fail_unsettled(error, whats)
    for slot in slots:
        slot.forget()
