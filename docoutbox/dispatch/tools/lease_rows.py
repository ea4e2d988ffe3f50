"""Who holds which partition, as the ``docoutbox leases`` command shows it, from the
items of any lease table (MongoDB documents, Cosmos DB items).

Items of kind ``lease`` (``group``, ``partition``, ``owner``, ``expires_at``, and
``acquired_at`` when the table records it) and ``member`` (``owner``, ``expires_at``,
``joined_at`` likewise) become rows; anything else (a released lease has no owner, a
Cosmos DB group also keeps its list of feed ranges) is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Reads a stored time (a datetime, or a string where the store keeps text) as an
#: aware UTC datetime, or None.
TimeOf = Callable[[object], datetime | None]


@dataclass(frozen=True)
class LeaseRow:
    group: str
    partition: int | None  # None for a member heartbeat
    owner: str
    since: datetime | None
    expires_at: datetime | None
    expired: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "partition": self.partition,
            "owner": self.owner,
            "since": self.since.isoformat() if self.since else None,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "expired": self.expired,
        }


def lease_rows(
    items: Iterable[Mapping[str, Any]], now: datetime, time_of: TimeOf
) -> list[LeaseRow]:
    """Every lease and member heartbeat among ``items``, in group and partition order."""
    rows = []
    for item in items:
        kind, owner = item.get("kind"), item.get("owner")
        if kind not in ("lease", "member") or not isinstance(owner, str):
            continue
        expires = time_of(item.get("expires_at"))
        since = time_of(item.get("acquired_at") if kind == "lease" else item.get("joined_at"))
        partition = item.get("partition") if kind == "lease" else None
        rows.append(
            LeaseRow(
                group=str(item.get("group")),
                partition=partition if type(partition) is int else None,
                owner=owner,
                since=since,
                expires_at=expires,
                expired=expires is not None and expires < now,
            )
        )
    rows.sort(key=lambda r: (r.group, r.partition is None, r.partition or 0, r.owner))
    return rows
