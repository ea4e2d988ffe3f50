"""Minimize a failing schedule: switch faults off and shrink it while it still fails."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tests.simulation.harness import Report
from tests.simulation.schedule import Variant

#: Numeric schedule fields, smallest value first, tried from the current value downward.
SIZES: tuple[tuple[str, int], ...] = (
    ("producers", 1),
    ("consumers", 1),
    ("commands", 1),
    ("max_targets", 1),
    ("producer_workers", 1),
    ("consumer_workers", 1),
    ("batch", 1),
)


def with_setting(variant: Variant, name: str, value: object) -> Variant:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    settings = (*((k, v) for k, v in variant.settings if k != name), (name, text))
    return replace(variant, settings=settings)


def shrink(report: Report, run: Callable[[Variant], Report]) -> Variant:
    """The simplest variant found that still breaks one of ``report``'s invariants."""
    broken = {v.invariant for v in report.violations}

    def fails(candidate: Variant) -> bool:
        return bool(broken & {v.invariant for v in run(candidate).violations})

    variant = report.variant
    for kind, p in variant.schedule().faults:
        candidate = replace(variant, off=(*variant.off, kind))
        if p and fails(candidate):
            variant = candidate
    for name, floor in SIZES:
        while (current := getattr(variant.schedule(), name)) > floor:
            candidate = with_setting(variant, name, current - 1)
            if not fails(candidate):
                break
            variant = candidate
    while (steps := variant.schedule().fault_steps) > 10:
        candidate = with_setting(variant, "fault_steps", steps // 2)
        if not fails(candidate):
            break
        variant = candidate
    return variant
