"""What a codec of stored values provides: one reversible step from bytes to bytes.

Rule: a step's output describes itself. Whatever a step needs to undo its work (a key
ID, a nonce, whether it compressed at all) travels in the bytes it returns, so a reader
holding the same step (and every key it may need) decodes any value the step ever wrote,
whatever the writer's settings are today. The chain of steps, the text form stored in a
document and the values it applies to are :mod:`docoutbox.stored`'s.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ValueCodec(Protocol):
    """One step of the encoding of a stored value, such as compression or encryption.

    ``name`` identifies the step inside the encoded value (lowercase letters and digits,
    1 to 16 characters; ``zlib`` and ``aesgcm`` are docoutbox's). ``decode`` raises
    :class:`~docoutbox.errors.CorruptValue` for bytes it cannot undo and
    :class:`~docoutbox.errors.UnknownKey` for a key it does not hold.

    ``context`` says where the value is stored (its aggregate, entry and field). A step
    that authenticates binds the value to it, so that a value copied to another place
    fails to decode there; other steps ignore it.
    """

    name: str

    def encode(self, data: bytes, context: bytes) -> bytes:
        """``data`` encoded; :meth:`decode` of the result, in the same ``context``, gives
        ``data`` back."""
        ...

    def decode(self, data: bytes, context: bytes) -> bytes:
        """The bytes :meth:`encode` was given in ``context``."""
        ...
