"""The recovery times read off acknowledgement times (tests/chaos/timing.py), on made-up times."""

from __future__ import annotations

from tests.chaos.timing import merged, recovery, table


def test_from_fault_from_heal_and_the_longest_gap() -> None:
    acks = merged([0.5, 1.0, 10.4], [1.2, 11.0, 12.0])
    r = recovery("cut", acks, fault_at=1.1, healed_at=10.0)
    assert r.from_fault is not None and abs(r.from_fault - 0.1) < 1e-9  # 1.2 was in flight
    assert r.from_heal is not None and abs(r.from_heal - 0.4) < 1e-9
    assert r.longest_gap is not None and abs(r.longest_gap - 9.2) < 1e-9  # 1.2 -> 10.4


def test_a_fault_nothing_followed_has_no_times() -> None:
    r = recovery("kill", [1.0, 2.0], fault_at=3.0, healed_at=4.0)
    assert (r.from_fault, r.from_heal, r.longest_gap) == (None, None, None)
    assert "never" in r.describe()


def test_the_table_has_a_line_per_kind_with_median_and_max() -> None:
    acks = [float(t) for t in range(100)]
    rows = [recovery("a", acks, 10.5, 20.5), recovery("a", acks, 30.5, 40.5), recovery("b", acks, 98.5, 99.5)]
    lines = table(rows)
    assert len(lines) == 4
    assert lines[2].split()[:4] == ["a", "2", "0.50/0.50", "0.50/0.50"]
    assert "(1 none)" in lines[3]  # nothing after 99.5
