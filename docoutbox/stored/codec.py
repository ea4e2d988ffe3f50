"""The encoded form of a stored value, and compression.

Rule: an encoded value is one string that names how to decode it::

    dx1:<step>[+<step>...]:<base64 of the bytes the last step returned>

``dx1`` is the version of this form; the steps are listed in the order they were
applied (``zlib+aesgcm``: compressed, then encrypted) and are undone in reverse. Each
step's own bytes carry what it needs (:mod:`docoutbox.ports.codec`), so a reader that
holds every step named decodes any value, whichever steps the writer uses today. A plain
value is a JSON object and an encoded one a string, so the two never mix up: a reader
decodes strings and takes objects as they are (documents written before encoding was
turned on).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections.abc import Sequence
from typing import Any

from docoutbox.errors import CorruptValue, InvalidConfig, UnknownCodec
from docoutbox.ports.codec import ValueCodec

#: The prefix of every encoded value (the version of the form).
PREFIX = "dx1"
_NAME = re.compile(r"[a-z0-9]{1,16}")


class Codec:
    """Encodes stored values with ``steps``, in order (compress first, then encrypt).

    ``readers``: more steps this codec can decode but does not write with (a step since
    turned off). Names must differ.

    >>> codec = Codec(Zlib(), AesGcm(keyring))
    """

    def __init__(self, *steps: ValueCodec, readers: Sequence[ValueCodec] = ()) -> None:
        if not steps:
            raise InvalidConfig("Codec needs at least one step, such as Zlib() or AesGcm(...)")
        known: dict[str, ValueCodec] = {}
        for step in (*steps, *readers):
            if not isinstance(step, ValueCodec):
                raise InvalidConfig(
                    f"a codec step must implement docoutbox.ports.codec.ValueCodec, "
                    f"got {type(step).__name__}"
                )
            name = step.name
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise InvalidConfig(f"a codec step's name must match [a-z0-9]{{1,16}}: {name!r}")
            if name in known:
                raise InvalidConfig(f"two codec steps are named {name!r}")
            known[name] = step
        self.steps: tuple[ValueCodec, ...] = tuple(steps)
        self._known = known
        self._head = f"{PREFIX}:{'+'.join(step.name for step in steps)}:"

    def encode(self, value: Any, context: str = "") -> str:
        """``value`` (JSON data) as an encoded string, bound to ``context`` (where it is
        stored) by the steps that authenticate."""
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        where = context.encode()
        for step in self.steps:
            data = step.encode(data, where)
        return self._head + base64.b64encode(data).decode("ascii")

    def decode(self, text: str, context: str = "") -> Any:
        """The JSON data ``text`` encodes, read where it was encoded for (``context``).

        :class:`~docoutbox.errors.CorruptValue` if it is not an encoded value or does not
        decode, :class:`~docoutbox.errors.UnknownCodec` if it names a step this codec was
        not given (and :class:`~docoutbox.errors.UnknownKey` from a step missing a key).
        """
        prefix, _, rest = text.partition(":")
        names, _, body = rest.partition(":")
        if prefix != PREFIX or not names or not body:
            raise CorruptValue(f"not an encoded value: {text[:40]!r}")
        try:
            data = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CorruptValue(f"an encoded value is not base64: {exc}") from exc
        where = context.encode()
        for name in reversed(names.split("+")):
            step = self._known.get(name)
            if step is None:
                raise UnknownCodec(
                    f"a stored value was encoded with {name!r}; this codec knows "
                    f"{sorted(self._known)}: pass that step to Codec(..., readers=[...])"
                )
            data = step.decode(data, where)
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptValue(f"a decoded value is not JSON: {exc}") from exc


def is_encoded(value: object) -> bool:
    """Whether a stored value is in the encoded form (a string) rather than plain."""
    return isinstance(value, str)


#: Zlib's first byte: what follows is the value as given, or deflated.
_RAW = b"\x00"
_DEFLATED = b"\x01"


class Zlib:
    """Compression with the standard library's zlib (step name ``zlib``).

    Values shorter than ``min_size`` bytes, and values compression would not shorten,
    are kept as they are (one leading byte says which), so small values never grow by
    more than a byte.
    """

    name = "zlib"

    def __init__(self, level: int = 6, min_size: int = 128) -> None:
        if type(level) is not int or not 0 <= level <= 9:
            raise InvalidConfig(f"Zlib level must be an int from 0 to 9, got {level!r}")
        if type(min_size) is not int or min_size < 0:
            raise InvalidConfig(f"Zlib min_size must be an int >= 0, got {min_size!r}")
        self.level = level
        self.min_size = min_size

    def encode(self, data: bytes, context: bytes = b"") -> bytes:
        if len(data) >= self.min_size:
            packed = zlib.compress(data, self.level)
            if len(packed) < len(data):
                return _DEFLATED + packed
        return _RAW + data

    def decode(self, data: bytes, context: bytes = b"") -> bytes:
        flag, body = data[:1], data[1:]
        if flag == _RAW:
            return body
        if flag != _DEFLATED:
            raise CorruptValue(f"zlib: unknown flag {flag!r}")
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise CorruptValue(f"zlib: {exc}") from exc
