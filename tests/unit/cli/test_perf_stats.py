"""The pure side of `waltz perf`: percentiles, the open-loop schedule, the send-time header, the summary."""

from __future__ import annotations

import pytest

from waltz_cli.perf_stats import (
    HEADER_MODULUS,
    TICK_S,
    OpenLoopSchedule,
    Recorder,
    Summary,
    header_age_s,
    percentile,
    progress_line,
    send_time_header,
)
from waltz_common.types import INT32_MAX


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 0.5) == 500 and percentile(values, 0.99) == 990 and percentile(values, 0.999) == 999
    assert percentile([7.0], 0.999) == 7.0 and percentile([], 0.5) is None


def test_the_open_loop_schedule_keeps_due_times_when_late() -> None:
    schedule = OpenLoopSchedule(100.0, start=10.0)
    assert schedule.take(10.0) == [10.0]
    assert schedule.take(10.035) == pytest.approx([10.01, 10.02, 10.03])  # late: all due ones, at their due times
    assert schedule.next_due() == pytest.approx(10.04)
    with pytest.raises(ValueError):
        OpenLoopSchedule(0, 0.0)


def test_the_send_time_header_fits_int32_and_survives_the_wrap() -> None:
    now = 1_800_000_000.123
    header = send_time_header(now)
    assert 0 <= header <= INT32_MAX
    assert header_age_s(header, now + 0.0042) == pytest.approx(0.0042, abs=TICK_S)
    wrap_at = (now // (HEADER_MODULUS * TICK_S) + 1) * HEADER_MODULUS * TICK_S  # the next wrap
    before = send_time_header(wrap_at - 0.001)
    assert before > send_time_header(wrap_at + 0.001)
    assert header_age_s(before, wrap_at + 0.001) == pytest.approx(0.002, abs=2 * TICK_S)


def test_summary_row_and_json() -> None:
    recorder = Recorder()
    for ms in range(1, 101):
        recorder.ok(ms / 1000)
    recorder.failed(TimeoutError("x"))
    summary = Summary.of("produce", recorder, 2.0, {"writers": 4}, lock_failures=3)
    data = summary.data()
    assert data["transactions"] == 100 and data["per_second"] == 50.0 and data["errors"] == 1
    assert (data["p50_ms"], data["p99_ms"], data["p999_ms"]) == (50.0, 99.0, 100.0)
    assert data["error_kinds"] == {"TimeoutError": 1} and data["settings"] == {"writers": 4}
    assert summary.row() == ["produce", "100", "2.0", "50", "50.00", "99.00", "100.00", 1, 3]
    assert len(summary.row()) == len(Summary.HEADERS)
    empty = Summary.of("consume", Recorder(), 1.0, {}, transactions=5)
    assert empty.row()[4:7] == ["-", "-", "-"] and empty.transactions == 5


def test_progress_line() -> None:
    line = progress_line("produce", 2.0, 10, 4000, 1, 0.0123)
    assert line == "produce   2.0/10 s  4,000 txn  2,000/s  p99 12.3 ms  errors 1"
    assert "p99 -" in progress_line("consume", 0.0, 5, 0, 0, None)
