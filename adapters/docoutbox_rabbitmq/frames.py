"""The AMQP 0-9-1 frames of one ``basic.publish``, encoded directly.

Rule: the bytes are exactly pamqp's marshalling of the same ``Basic.Publish`` method
frame, the content header with the ``Basic.Properties`` that
:func:`~docoutbox_rabbitmq.aio.amqp_properties` builds, and the body frames of at most
``frame_max`` bytes each (the unit tests compare them byte for byte). Field tables are
pamqp's own encoder; only the fixed layout around them is written here, because
building pamqp's frame objects and marshalling them by reflection cost more than the
rest of a publish; for the same reason a table of strings and integers (an entry's
usual headers) is written by :func:`table`, byte-equal to pamqp's, and any other table
by pamqp. A value the protocol cannot carry (a short string over 255 bytes)
raises :class:`~docoutbox.errors.PermanentPublishError` before anything is sent.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from pamqp import encode

from docoutbox.errors import PermanentPublishError

#: frame type, channel, payload size: the head of every frame; every frame ends in 0xCE.
_HEAD = struct.Struct(">BHI")
_END = b"\xce"
#: Basic (class 60), Publish (method 40), the reserved ticket (0).
_PUBLISH = struct.pack(">HHH", 60, 40, 0)
#: Basic (class 60), weight 0, body size (the property flags follow).
_CONTENT = struct.Struct(">HHQ")
_OCTET = struct.Struct(">B")
_TIMESTAMP = struct.Struct(">Q")
_LONG = struct.Struct(">I")
#: pamqp's choice of integer field type: the smallest that holds the value, in this order.
_INTEGERS = (
    (-128, 127, b"b", struct.Struct(">b")),
    (-32768, 32767, b"s", struct.Struct(">h")),
    (0, 65535, b"u", struct.Struct(">H")),
    (-(2**31), 2**31 - 1, b"I", struct.Struct(">i")),
    (0, 2**32 - 1, b"i", struct.Struct(">I")),
    (-(2**63), 2**63 - 1, b"l", struct.Struct(">q")),
)
#: The bytes a body frame adds around its payload (aiormq's ``CONTENT_FRAME_SIZE``).
BODY_OVERHEAD = _HEAD.size + len(_END)

#: The property flags, in the order of their values in a content header.
CONTENT_TYPE = 1 << 15
HEADERS = 1 << 13
DELIVERY_MODE = 1 << 12
PRIORITY = 1 << 11
CORRELATION_ID = 1 << 10
MESSAGE_ID = 1 << 7
TIMESTAMP = 1 << 6
TYPE = 1 << 5

#: The property fields :func:`~docoutbox_rabbitmq.amqp.message_for` makes.
FIELDS = frozenset(
    {
        "content_type",
        "delivery_mode",
        "message_id",
        "type",
        "timestamp",
        "correlation_id",
        "headers",
    }
)


def short_string(value: str, name: str) -> bytes:
    """``value`` as an AMQP short string; ``PermanentPublishError`` over 255 bytes."""
    data = value.encode("utf-8")
    if len(data) > 255:
        raise PermanentPublishError(
            f"{name} is {len(data)} bytes; AMQP carries at most 255: {value[:40]!r}..."
        )
    return _OCTET.pack(len(data)) + data


def table(values: Mapping[str, Any]) -> bytes:
    """``values`` as an AMQP field table, byte-equal to ``pamqp.encode.field_table``: keys
    sorted, strings as long strings, integers in the smallest type pamqp picks. A table
    holding anything else (a bool, a nested table, a key over 128 bytes, ...) is
    pamqp's own encoding."""
    if not values:
        return b"\x00\x00\x00\x00"
    if encode.DEPRECATED_RABBITMQ_SUPPORT:
        return encode.field_table(dict(values))
    parts: list[bytes] = []
    for key in sorted(values):
        value = values[key]
        name = key.encode("utf-8")
        if len(name) > 128:
            return encode.field_table(dict(values))
        parts += (_OCTET.pack(len(name)), name)
        kind = type(value)
        if kind is str:
            data = value.encode("utf-8")
            parts += (b"S", _LONG.pack(len(data)), data)
        elif kind is int:
            for low, high, tag, layout in _INTEGERS:
                if low <= value <= high:
                    parts += (tag, layout.pack(value))
                    break
            else:
                return encode.field_table(dict(values))
        else:
            return encode.field_table(dict(values))
    data = b"".join(parts)
    return _LONG.pack(len(data)) + data


def properties(fields: Mapping[str, Any]) -> bytes:
    """The property flags and values of a content header for ``fields`` (those of
    :data:`FIELDS`), as pamqp marshals ``amqp_properties(fields)``: persistence, priority
    0 and the headers table are always present, the other fields when set."""
    flags = HEADERS | DELIVERY_MODE | PRIORITY
    parts: list[bytes] = []
    content_type = fields.get("content_type")
    if content_type:
        flags |= CONTENT_TYPE
        parts.append(short_string(content_type, "content_type"))
    try:
        parts.append(table(fields.get("headers") or {}))
    except (TypeError, ValueError) as exc:
        raise PermanentPublishError(f"headers cannot be sent as an AMQP table: {exc}") from None
    parts.append(_OCTET.pack(int(fields.get("delivery_mode") or 1)))
    parts.append(b"\x00")  # priority 0
    correlation_id = fields.get("correlation_id")
    if correlation_id is not None and correlation_id != "":
        flags |= CORRELATION_ID
        parts.append(short_string(str(correlation_id), "correlation_id"))
    message_id = fields.get("message_id")
    if message_id:
        flags |= MESSAGE_ID
        parts.append(short_string(message_id, "message_id"))
    timestamp = fields.get("timestamp")
    if timestamp is not None:
        flags |= TIMESTAMP
        parts.append(_TIMESTAMP.pack(int(timestamp)))
    message_type = fields.get("type")
    if message_type:
        flags |= TYPE
        parts.append(short_string(message_type, "type"))
    return struct.pack(">H", flags) + b"".join(parts)


def publish(
    channel: int,
    exchange: bytes,
    routing_key: bytes,
    mandatory: bool,
    props: bytes,
    body: bytes,
    max_content: int,
) -> bytes:
    """The frames of one ``basic.publish`` on ``channel``: the method frame (``exchange``
    and ``routing_key`` already short strings), the content header (``props`` from
    :func:`properties`), and the body in frames of at most ``max_content`` bytes
    (``frame_max`` less :data:`BODY_OVERHEAD`)."""
    method = _PUBLISH + exchange + routing_key
    method += b"\x01" if mandatory else b"\x00"
    header = _CONTENT.pack(60, 0, len(body)) + props
    frames = [
        _HEAD.pack(1, channel, len(method)),
        method,
        _END,
        _HEAD.pack(2, channel, len(header)),
        header,
        _END,
    ]
    for start in range(0, len(body), max_content):
        chunk = body[start : start + max_content]
        frames += (_HEAD.pack(3, channel, len(chunk)), chunk, _END)
    return b"".join(frames)
