"""The pure side of `waltz perf`: latencies and their percentiles, the open-loop schedule, the send-time
header, the progress line and the summary (table row and JSON); no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

TICK_S = 1e-4  # the header's unit: 100 µs
HEADER_MODULUS = 2**31  # a header is a signed 32-bit int: the send time wraps every ~2.5 days


def send_time_header(now_s: float) -> int:
    """The header `perf produce` writes: its wall-clock send time in 100 µs ticks, modulo 2^31."""
    return int(now_s / TICK_S) % HEADER_MODULUS


def header_age_s(header: int, now_s: float) -> float:
    """Seconds since the send time a header carries (right for ages under the ~2.5 day wrap)."""
    return ((int(now_s / TICK_S) - header) % HEADER_MODULUS) * TICK_S


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Recorder:
    """Latencies (seconds) and errors of one run."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    def ok(self, latency_s: float) -> None:
        self.latencies.append(latency_s)

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        kind = type(exc).__name__
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    @property
    def count(self) -> int:
        return len(self.latencies)

    def recent_p99(self, last: int = 2000) -> float | None:
        return percentile(sorted(self.latencies[-last:]), 0.99)


class OpenLoopSchedule:
    """When each send is due at a fixed rate from start; a late send keeps its due time (latency is
    counted from it, so a stall is not hidden: no coordinated omission)."""

    def __init__(self, rate: float, start: float) -> None:
        if rate <= 0:
            raise ValueError("the rate must be positive")
        self.interval = 1.0 / rate
        self.start = start
        self.sent = 0

    def next_due(self) -> float:
        return self.start + self.sent * self.interval

    def take(self, now: float) -> list[float]:
        """The due times of every send due by now (marked sent)."""
        due: list[float] = []
        while (t := self.next_due()) <= now:
            due.append(t)
            self.sent += 1
        return due


def progress_line(operation: str, elapsed_s: float, duration_s: float, done: int, errors: int,
                  p99_s: float | None) -> str:
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    p99 = f"{p99_s * 1000:.1f} ms" if p99_s is not None else "-"
    return (f"{operation} {elapsed_s:5.1f}/{duration_s:g} s  {done:,} txn  {rate:,.0f}/s  p99 {p99}  "
            f"errors {errors}")


@dataclass
class Summary:
    """What a run reports (the JSON of --json; one table row for people)."""

    operation: str
    transactions: int
    seconds: float
    per_second: float
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    errors: int
    settings: dict[str, Any]
    lock_failures: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(operation: str, recorder: Recorder, seconds: float, settings: dict[str, Any],
           lock_failures: int = 0, transactions: int | None = None) -> Summary:
        ordered = sorted(recorder.latencies)
        count = recorder.count if transactions is None else transactions

        def ms(fraction: float) -> float | None:
            value = percentile(ordered, fraction)
            return None if value is None else round(value * 1000, 3)

        return Summary(operation, count, round(seconds, 3), round(count / seconds, 1) if seconds > 0 else 0.0,
                       ms(0.50), ms(0.99), ms(0.999), recorder.errors, settings, lock_failures,
                       dict(recorder.error_kinds))

    def data(self) -> dict[str, Any]:
        return asdict(self)

    HEADERS = ("operation", "transactions", "seconds", "per second", "p50 ms", "p99 ms", "p99.9 ms", "errors",
               "lock failures")

    def row(self) -> list[object]:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        return [self.operation, f"{self.transactions:,}", f"{self.seconds:.1f}", f"{self.per_second:,.0f}",
                ms(self.p50_ms), ms(self.p99_ms), ms(self.p999_ms), self.errors, self.lock_failures]
