"""Recovery times read off acknowledgement times: how long a fault kept appends from being acknowledged.

A fault is inflicted at one moment and healed (the process restarted, the link mended) at a later one;
the acknowledgements are the monotonic times at which submissions' futures ended True. For each fault:

- from fault: the time from the fault to the first acknowledgement after it (an append already in flight
  counts: it is what a user sees next);
- from heal: the time from the healing to the first acknowledgement after it;
- longest gap: the longest stretch without an acknowledgement from the fault to the first one after the
  healing (what the fault cost, whether the stall came at the fault, at the healing or later).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Recovery:
    kind: str
    fault_at: float
    healed_at: float
    from_fault: float | None  # None: no acknowledgement followed
    from_heal: float | None
    longest_gap: float | None

    def describe(self) -> str:
        return (
            f"held {self.healed_at - self.fault_at:.1f} s; next acknowledgement {_seconds(self.from_fault)} after the "
            f"fault, {_seconds(self.from_heal)} after the heal; longest gap {_seconds(self.longest_gap)}"
        )


def merged(*series: Iterable[float]) -> list[float]:
    """Several writers' acknowledgement times as one sorted sequence."""
    return sorted(t for times in series for t in times)


def recovery(kind: str, acked_at: Sequence[float], fault_at: float, healed_at: float) -> Recovery:
    """The recovery of one fault from the sorted acknowledgement times."""
    first_after_fault = _first_after(acked_at, fault_at)
    first_after_heal = _first_after(acked_at, healed_at)
    gap = None
    if first_after_heal is not None:
        start = bisect.bisect_right(acked_at, fault_at)
        end = bisect.bisect_right(acked_at, first_after_heal)
        points = [fault_at, *acked_at[start:end]]
        gap = max(b - a for a, b in itertools.pairwise(points))
    return Recovery(
        kind,
        fault_at,
        healed_at,
        None if first_after_fault is None else first_after_fault - fault_at,
        None if first_after_heal is None else first_after_heal - healed_at,
        gap,
    )


def _first_after(acked_at: Sequence[float], moment: float) -> float | None:
    index = bisect.bisect_right(acked_at, moment)
    return acked_at[index] if index < len(acked_at) else None


def table(recoveries: Sequence[Recovery]) -> list[str]:
    """One line per fault kind: count, median and max of each measure (seconds), as fixed-width text."""
    header = f"{'fault':<24}{'n':>4}  {'from fault med/max':>20}  {'from heal med/max':>20}  {'gap med/max':>16}"
    lines = [header, "-" * len(header)]
    kinds = sorted({r.kind for r in recoveries})
    for kind in kinds:
        rows = [r for r in recoveries if r.kind == kind]
        lines.append(
            f"{kind:<24}{len(rows):>4}  {_spread([r.from_fault for r in rows]):>20}  "
            f"{_spread([r.from_heal for r in rows]):>20}  {_spread([r.longest_gap for r in rows]):>16}"
        )
    return lines


def _spread(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    missing = len(values) - len(known)
    text = f"{statistics.median(known):.2f}/{max(known):.2f}" if known else "-"
    return text + (f" ({missing} none)" if missing else "")


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"
