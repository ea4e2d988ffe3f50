"""The publishing connection's frame reader: every frame the broker sends is delivered
once, in order, however the byte stream is cut into reads, and ``basic.ack`` /
``basic.nack`` come out decoded as the numbers pamqp would read."""

from __future__ import annotations

from typing import Any

import pamqp.frame
import pytest
from pamqp.body import ContentBody
from pamqp.commands import Basic, Channel, Connection
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from docoutbox.errors import BrokerUnavailable
from docoutbox_rabbitmq.inbound import FrameError, Reader

#: A confirm-mode channel's traffic: confirms, a return with its content, a heartbeat, the
#: broker blocking the connection, a body over one read, and the channel's close.
FRAMES: list[tuple[Any, int]] = [
    (Basic.Ack(1), 1),
    (Basic.Ack(2**62 + 5, multiple=True), 1),
    (Basic.Nack(7, multiple=False, requeue=True), 1),
    (Basic.Nack(9, multiple=True), 1),
    (Basic.Return(312, "NO_ROUTE", "ex", "key"), 1),
    (ContentHeader(0, 300, Basic.Properties(message_id="m-1")), 1),
    (ContentBody(b"x" * 300), 1),
    (Heartbeat(), 0),
    (Connection.Blocked("low on memory"), 0),
    (Basic.Ack(10), 1),
    (Channel.Close(404, "NOT_FOUND", 60, 40), 1),
]
STREAM = b"".join(pamqp.frame.marshal(frame, channel) for frame, channel in FRAMES)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def ack(self, tag: int, multiple: bool) -> None:
        self.seen.append(("ack", tag, multiple))

    def nack(self, tag: int, multiple: bool) -> None:
        self.seen.append(("nack", tag, multiple))

    def frame(self, kind: int, channel: int, raw: bytes) -> None:
        used, number, value = pamqp.frame.unmarshal(raw)
        assert used == len(raw) and number == channel
        self.seen.append((kind, channel, type(value).__name__))


def expected() -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for frame, channel in FRAMES:
        if isinstance(frame, Basic.Ack | Basic.Nack):
            name = "ack" if isinstance(frame, Basic.Ack) else "nack"
            out.append((name, frame.delivery_tag, frame.multiple))
        else:
            kind = {ContentHeader: 2, ContentBody: 3, Heartbeat: 8}.get(type(frame), 1)
            out.append((kind, channel, type(frame).__name__))
    return out


def read(*pieces: bytes) -> list[tuple[Any, ...]]:
    recorder = Recorder()
    reader = Reader(recorder)
    for piece in pieces:
        reader.feed(piece)
    assert not reader.buffer, "bytes left over"
    return recorder.seen


def test_the_whole_stream_in_one_read() -> None:
    assert read(STREAM) == expected()


def test_a_stream_cut_at_any_offset_gives_the_same_frames() -> None:
    for cut in range(1, len(STREAM)):
        assert read(STREAM[:cut], STREAM[cut:]) == expected(), f"cut at byte {cut}"


def test_one_byte_at_a_time_and_merged_pieces_give_the_same_frames() -> None:
    assert read(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == expected()
    assert read(STREAM[:5], STREAM[5:40] + STREAM[40:41], b"", STREAM[41:]) == expected()


def test_an_incomplete_frame_waits_for_its_rest() -> None:
    recorder = Recorder()
    reader = Reader(recorder)
    ack = pamqp.frame.marshal(Basic.Ack(3), 1)
    reader.feed(ack[:-1])
    assert recorder.seen == [] and bytes(reader.buffer) == ack[:-1]
    reader.feed(ack[-1:])
    assert recorder.seen == [("ack", 3, False)] and not reader.buffer


def test_a_frame_without_its_end_octet_is_a_broken_connection() -> None:
    broken = bytearray(pamqp.frame.marshal(Basic.Ack(3), 1))
    broken[-1] = 0
    with pytest.raises(FrameError, match="end octet 0x0") as caught:
        read(bytes(broken))
    assert isinstance(caught.value, BrokerUnavailable)


def test_a_sink_error_leaves_no_frame_delivered_twice() -> None:
    """A frame whose handling raises is consumed: the next read starts after it."""

    class Failing(Recorder):
        def ack(self, tag: int, multiple: bool) -> None:
            super().ack(tag, multiple)
            if tag == 1:
                raise RuntimeError("boom")

    recorder = Failing()
    reader = Reader(recorder)
    two = pamqp.frame.marshal(Basic.Ack(1), 1) + pamqp.frame.marshal(Basic.Ack(2), 1)
    with pytest.raises(RuntimeError):
        reader.feed(two)
    reader.feed(b"")
    assert recorder.seen == [("ack", 1, False), ("ack", 2, False)]
