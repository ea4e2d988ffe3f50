"""AMQP 0-9-1 frames out of a byte stream, for a publishing connection.

Rule: every byte the broker sends is consumed exactly once, in order, whatever the
split of the stream into reads: a frame cut anywhere waits in the buffer for its rest,
and several frames in one read are all delivered. ``basic.ack`` and ``basic.nack`` (the
frames a confirming publisher receives per message) are decoded here with one
``struct.unpack_from`` each and handed on as numbers; every other frame is handed on
whole (head, payload and end octet), for :func:`pamqp.frame.unmarshal`. A frame whose
end octet is not ``0xCE`` raises :class:`FrameError`: the stream cannot be trusted past
it.
"""

from __future__ import annotations

import struct
from typing import Protocol

from docoutbox.errors import BrokerUnavailable

#: frame type, channel, payload size: the head of every frame.
HEAD = struct.Struct(">BHI")
#: class, method, delivery tag, bits: the whole payload of ``basic.ack`` / ``basic.nack``.
_CONFIRM = struct.Struct(">HHQB")
_FRAME_END = 0xCE
METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
#: Basic (60): Ack (80), Nack (120).
_BASIC, _ACK, _NACK = 60, 80, 120


class FrameError(BrokerUnavailable):
    """The broker's byte stream is not AMQP 0-9-1 frames: the connection is unusable."""


class Sink(Protocol):
    """Where :class:`Reader` delivers what it reads."""

    def ack(self, tag: int, multiple: bool) -> None: ...

    def nack(self, tag: int, multiple: bool) -> None: ...

    def frame(self, kind: int, channel: int, raw: bytes) -> None: ...


class Reader:
    """Splits the broker's bytes into frames for a :class:`Sink`."""

    __slots__ = ("buffer", "sink")

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.buffer = bytearray()

    def feed(self, data: bytes) -> None:
        """Take ``data`` (any piece of the stream) and deliver every frame it completes."""
        buffer = self.buffer
        buffer += data
        size, pos = len(buffer), 0
        sink = self.sink
        try:
            while size - pos >= 8:
                kind, channel, length = HEAD.unpack_from(buffer, pos)
                end = pos + 7 + length
                if end >= size:
                    break
                if buffer[end] != _FRAME_END:
                    raise FrameError(
                        f"malformed AMQP frame from the broker: type {kind}, channel "
                        f"{channel}, {length} bytes, end octet {buffer[end]:#x}"
                    )
                if kind == METHOD and length == 13:
                    klass, method, tag, bits = _CONFIRM.unpack_from(buffer, pos + 7)
                    if klass == _BASIC and method == _ACK:
                        pos = end + 1
                        sink.ack(tag, bool(bits & 1))
                        continue
                    if klass == _BASIC and method == _NACK:
                        pos = end + 1
                        sink.nack(tag, bool(bits & 1))
                        continue
                raw = bytes(buffer[pos : end + 1])
                pos = end + 1
                sink.frame(kind, channel, raw)
        finally:
            del buffer[:pos]
