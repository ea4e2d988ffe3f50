"""What is stored, as stored: encoded values and old model versions.

Rule: only values are encoded (an aggregate's state, each outbox entry's payload and
headers); everything the store, the dispatcher, the trims, the inbox and the audit decide
on (ids, ``version``, ``seq``, types, times, attempts, sizes) stays plain.

- :mod:`~docoutbox.stored.codec`: :class:`Codec`, the chain of steps and the text form of
  an encoded value, and :class:`Zlib`, compression with the standard library;
- :mod:`~docoutbox.stored.crypto`: :class:`Keyring` and :class:`AesGcm`, encryption with
  rotation by key ID (the optional ``docoutbox[crypto]`` extra);
- :mod:`~docoutbox.stored.upcast`: :class:`Upcasters`, functions that turn an old stored
  state or entry payload into the current model, per (type, version);
- :mod:`~docoutbox.stored.claim`: :class:`ClaimCheck`, large payloads put in a payload
  store before the commit, resolved before publishing, deleted after the trim;
- :mod:`~docoutbox.stored.chunks`: payloads split into chunks, for payload stores of
  size-limited items;
- :mod:`~docoutbox.stored.reference`: how a claim-checked entry refers to its payload;
- :mod:`~docoutbox.stored.sweep`: the sweep of orphaned payloads;
- :mod:`~docoutbox.stored.values`: :class:`StoredValues`, the one place the store, the
  dispatcher and the readers encode, decode and upcast documents and entries.
"""

from docoutbox.stored.codec import Codec, Zlib
from docoutbox.stored.crypto import AesGcm, Keyring
from docoutbox.stored.upcast import Upcasters
from docoutbox.stored.values import StoredValues

__all__ = ["AesGcm", "Codec", "Keyring", "StoredValues", "Upcasters", "Zlib"]
