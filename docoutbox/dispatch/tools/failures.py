"""Dead letters by failure group: one fingerprint per kind of failure.

Rule: a fingerprint depends only on the error's type and its message with every value
that changes from one occurrence to the next replaced by a placeholder, so that a
thousand entries refused for the same reason form one group, and two reasons never share
one (short of a hash collision on 64 bits).

- The error's type is the leading ``Name:`` of the stored error text (the dispatcher
  stores ``"PermanentPublishError: ..."``, a consumer ``"message <id>: ValueError: ..."``;
  the ``message <id>:`` prefix is dropped), or ``""`` when the text names none (``"gave
  up after 4 attempts"``).
- The message is normalized (:func:`normalize`): the dead letter's own entry ID,
  aggregate ID and queue become ``<entry>``, ``<aggregate>`` and ``<queue>``; then quoted
  values become ``<q>``, timestamps ``<time>``, UUIDs ``<uuid>``, hex values ``<hex>``,
  words mixing letters and digits ``<id>``, numbers ``<n>``; runs of blanks become one.
- The fingerprint is the first 16 hex digits of the SHA-256 of ``type`` and message.

Pure: :func:`failure_groups` summarizes mappings as the dead-letter stores show them
(``_id``, ``error``, ``entry``, ``aggregate_id``, ``queue``, ``quarantined_at``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: ``message <id>: `` or ``a delivery: `` before a consumer's error.
_CONSUMER = re.compile(r"^(?:message \S+|a delivery): ")
#: A leading error type: a dotted identifier followed by ``": "``.
_TYPE = re.compile(r"^([A-Za-z_][\w.]*): ")

#: (pattern, placeholder), applied in this order after the known values.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`"), "<q>"),
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2}|\b)"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]+\b"), "<id>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def _known(dead_letter: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The dead letter's own values (longest first), with their placeholders."""
    entry = dead_letter.get("entry")
    entry_id = entry.get("id") if isinstance(entry, Mapping) else None
    found = [
        (entry_id, "<entry>"),
        (dead_letter.get("_id"), "<entry>"),
        (dead_letter.get("aggregate_id"), "<aggregate>"),
        (dead_letter.get("queue"), "<queue>"),
    ]
    values = {str(v): mark for v, mark in found if isinstance(v, str | int) and str(v)}
    return sorted(values.items(), key=lambda kv: -len(kv[0]))


def normalize(text: str, known: Iterable[tuple[str, str]] = ()) -> str:
    """``text`` with its varying values replaced by placeholders (see the module doc)."""
    for value, mark in known:
        text = text.replace(value, mark)
    for pattern, mark in _PATTERNS:
        text = pattern.sub(mark, text)
    return text.strip()


@dataclass(frozen=True)
class Failure:
    """What failed, as the fingerprint sees it."""

    error_type: str
    message: str

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(f"{self.error_type}\n{self.message}".encode())
        return digest.hexdigest()[:16]


def failure_of(dead_letter: Mapping[str, Any]) -> Failure:
    """The failure of one dead letter (its error's type and normalized message)."""
    text = str(dead_letter.get("error") or "")
    text = _CONSUMER.sub("", text, count=1)
    match = _TYPE.match(text)
    error_type = match.group(1) if match else ""
    rest = text[match.end() :] if match else text
    return Failure(error_type, normalize(rest, _known(dead_letter)))


def fingerprint(dead_letter: Mapping[str, Any]) -> str:
    return failure_of(dead_letter).fingerprint


@dataclass(frozen=True)
class FailureGroup:
    """The dead letters of one fingerprint: how many, when, and one of them."""

    fingerprint: str
    error_type: str
    message: str
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    example_id: str

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "error_type": self.error_type,
            "message": self.message,
            "count": self.count,
            "first_seen": self.first_seen.isoformat() if self.first_seen else None,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
            "example_id": self.example_id,
        }


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def failure_groups(dead_letters: Iterable[Mapping[str, Any]]) -> list[FailureGroup]:
    """The groups of ``dead_letters``, largest first (then by fingerprint). The example is
    the group's oldest dead letter."""
    acc: dict[str, list[Any]] = {}
    for doc in dead_letters:
        failure = failure_of(doc)
        seen = _aware(doc.get("quarantined_at"))
        slot = acc.get(failure.fingerprint)
        if slot is None:
            acc[failure.fingerprint] = [failure, 1, seen, seen, str(doc.get("_id"))]
            continue
        slot[1] += 1
        if seen is not None and (slot[2] is None or seen < slot[2]):
            slot[2], slot[4] = seen, str(doc.get("_id"))
        if seen is not None and (slot[3] is None or seen > slot[3]):
            slot[3] = seen
    groups = [
        FailureGroup(fp, f.error_type, f.message, count, first, last, example)
        for fp, (f, count, first, last, example) in acc.items()
    ]
    groups.sort(key=lambda g: (-g.count, g.fingerprint))
    return groups
