"""Pure inbox logic: de-duplication by ID window or by exact per-source watermarks."""

from __future__ import annotations

from dataclasses import dataclass

from docoutbox.errors import InboxSaturated
from docoutbox.model import InboxPolicy, Message


@dataclass(frozen=True)
class Mark:
    """What a receiver has seen of one source: every seq <= hw, plus ``above``."""

    source: str
    hw: int
    above: tuple[int, ...] = ()

    def seen(self, seq: int) -> bool:
        return seq <= self.hw or seq in self.above

    def record(self, seq: int) -> Mark:
        above = set(self.above)
        above.add(seq)
        hw = self.hw
        while hw + 1 in above:
            hw += 1
            above.discard(hw)
        return Mark(self.source, hw, tuple(sorted(above)))

    def to_doc(self) -> dict[str, object]:
        return {"source": self.source, "hw": self.hw, "above": list(self.above)}


def uses_marks(policy: InboxPolicy, message: Message) -> bool:
    return policy.exact and message.source is not None and message.seq is not None


def is_duplicate(
    policy: InboxPolicy, inbox: tuple[str, ...], marks: dict[str, Mark], message: Message
) -> bool:
    """True when ``message`` was already processed, as far as retention can tell."""
    if policy.exact and message.source is not None and message.seq is not None:  # uses_marks
        mark = marks.get(message.source)
        return mark is not None and mark.seen(message.seq)
    return message.id in inbox


def record_mark(policy: InboxPolicy, marks: dict[str, Mark], message: Message) -> list[Mark]:
    """The marks after recording ``message``; refuses to exceed ``policy.max_above``."""
    assert message.source is not None
    assert message.seq is not None
    mark = marks.get(message.source, Mark(message.source, 0)).record(message.seq)
    if len(mark.above) > policy.max_above:
        raise InboxSaturated(
            f"source {message.source!r}: {len(mark.above)} sequence numbers above the "
            f"watermark {mark.hw} would exceed max_above={policy.max_above}"
        )
    updated = dict(marks)
    updated[message.source] = mark
    return list(updated.values())
