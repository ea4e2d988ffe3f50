"""How a claim-checked entry refers to its payload (:mod:`docoutbox.stored.claim`).

Rule: a claim-checked entry has no ``payload`` field and has ``claim: {"id", "size",
"encoded"}``: the payload's ID in the payload store, the size in bytes of its stored
form, and whether that form is encoded. Read without resolving, its payload is the
reference envelope (:func:`envelope`), never an empty or made-up payload.
"""

from __future__ import annotations

from typing import Any

#: The stored field of a claim-checked entry holding its reference.
CLAIM = "claim"
#: The key of the reference envelope (a payload that stands for a claim-checked one).
ENVELOPE = "docoutbox_claim"


def claim_of(entry: object) -> dict[str, Any] | None:
    """The reference of a claim-checked stored entry, or None."""
    if not isinstance(entry, dict):
        return None
    claim = entry.get(CLAIM)
    return claim if isinstance(claim, dict) else None


def envelope(entry: dict[str, Any], context: str) -> dict[str, Any]:
    """What a claim-checked entry's payload reads as without resolving: its reference.

    ``{"docoutbox_claim": {"id", "size", "encoded", "context"}}``: the payload ID, the
    stored form's size in bytes, whether that form is encoded (then decode it with the
    writer's codec, in ``context``, where the entry's payload is stored)."""
    claim = claim_of(entry) or {}
    return {
        ENVELOPE: {
            "id": claim.get("id"),
            "size": claim.get("size"),
            "encoded": bool(claim.get("encoded")),
            "context": context,
        }
    }
