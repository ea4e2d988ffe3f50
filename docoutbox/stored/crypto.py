"""Encryption of stored values with AES-GCM, and key rotation by key ID.

Rule: every encrypted value names the key it was written under. A :class:`Keyring` has
one current key, used for every write, and any number of older keys, used only to read:
rotate by making a new key current and keeping the old one until nothing stored uses it.
A value under a key ID the keyring lacks raises :class:`~docoutbox.errors.UnknownKey`;
a value that fails authentication (altered or cut) raises
:class:`~docoutbox.errors.CorruptValue`.

The bytes of an encrypted value (step ``aesgcm``)::

    <1 byte: length n of the key ID> <n bytes: key ID, ASCII> <12 bytes: nonce>
    <ciphertext and 16-byte tag>

The key ID, the nonce and the value's context (where it is stored: its aggregate type
and ID, and its entry and field) are authenticated too (associated data), so a value
copied to another document, entry or field fails authentication there. Needs the
``cryptography`` package: ``pip install docoutbox[crypto]``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from docoutbox.errors import CorruptValue, InvalidConfig, UnknownKey

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NONCE = 12
_KEY_SIZES = (16, 24, 32)


class Keyring:
    """Keys by ID: ``current`` writes, every key reads.

    >>> keyring = Keyring({"2026-11": new_key, "2026-05": old_key}, current="2026-11")

    Keys are 16, 24 or 32 bytes (AES-128, -192, -256); IDs are 1 to 64 characters of
    ``[A-Za-z0-9._-]`` and are stored in the clear with every value.
    """

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise InvalidConfig("Keyring needs a mapping of at least one key ID to its key")
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise InvalidConfig(f"a key ID must match [A-Za-z0-9._-]{{1,64}}: {key_id!r}")
            if not isinstance(key, bytes) or len(key) not in _KEY_SIZES:
                raise InvalidConfig(f"key {key_id!r} must be 16, 24 or 32 bytes")
        if current not in keys:
            raise InvalidConfig(f"the current key {current!r} is not in the keyring")
        self.keys: dict[str, bytes] = dict(keys)
        self.current = current

    def __repr__(self) -> str:  # never the keys themselves
        return f"Keyring(ids={sorted(self.keys)!r}, current={self.current!r})"


class AesGcm:
    """Encryption with AES-GCM under a :class:`Keyring` (step name ``aesgcm``)."""

    name = "aesgcm"

    def __init__(self, keyring: Keyring) -> None:
        if not isinstance(keyring, Keyring):
            raise InvalidConfig(f"AesGcm needs a Keyring, got {type(keyring).__name__}")
        try:  # the optional extra, imported on use
            from cryptography.exceptions import InvalidTag  # noqa: PLC0415
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415
        except ImportError as exc:  # pragma: no cover - the extra is installed in CI
            raise InvalidConfig(
                "encryption needs the cryptography package: pip install docoutbox[crypto]"
            ) from exc
        self.keyring = keyring
        self._invalid_tag: type[Exception] = InvalidTag
        self._ciphers: dict[str, Any] = {k: AESGCM(v) for k, v in keyring.keys.items()}
        current = keyring.current.encode("ascii")
        self._head = bytes([len(current)]) + current

    def __reduce__(self) -> tuple[type[AesGcm], tuple[Keyring]]:
        """Pickled as its keyring (the ciphers are rebuilt), so a reader can ship it to
        other processes, such as Spark executors."""
        return (AesGcm, (self.keyring,))

    def encode(self, data: bytes, context: bytes = b"") -> bytes:
        nonce = os.urandom(_NONCE)
        header = self._head + nonce
        cipher = self._ciphers[self.keyring.current]
        sealed: bytes = cipher.encrypt(nonce, data, header + context)
        return header + sealed

    def decode(self, data: bytes, context: bytes = b"") -> bytes:
        if not data:
            raise CorruptValue("aesgcm: empty value")
        size = data[0]
        header_end = 1 + size + _NONCE
        if size == 0 or len(data) < header_end + 16:
            raise CorruptValue("aesgcm: value too short")
        try:
            key_id = data[1 : 1 + size].decode("ascii")
        except UnicodeDecodeError as exc:
            raise CorruptValue("aesgcm: the key ID is not ASCII") from exc
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownKey(
                f"a stored value was encrypted under key {key_id!r}, which the keyring "
                f"{sorted(self._ciphers)} does not hold"
            )
        nonce = data[1 + size : header_end]
        try:
            plain: bytes = cipher.decrypt(nonce, data[header_end:], data[:header_end] + context)
        except self._invalid_tag as exc:
            raise CorruptValue(
                f"aesgcm: value under key {key_id!r} fails authentication (altered, or copied "
                "from another document, entry or field)"
            ) from exc
        return plain
