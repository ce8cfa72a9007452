"""bench.contention's figures from the instances' results: the windows' shares and the streak on an item."""

from __future__ import annotations

from typing import Any

from bench.contention import same_instance_next, summarize


def _result(name: str, commits: list[float], rows: list[list[Any]], final: int) -> dict[str, Any]:
    return {"name": name, "started": 0.0, "ended": 20.0, "commits": commits, "lock_failures": [], "reexecutions": [],
            "lags": [(1.0, 0)], "callback_cpu_s": 0.0, "stale": 0, "error_count": 0, "rows": rows, "final": final}


def test_same_instance_next_counts_each_item_apart_from_first_id_on() -> None:
    rows = [[0, 1, 0, "a"], [1, 1, 1, "a"], [2, 2, 0, "b"], [3, 1, 2, "b"], [4, 2, 1, "b"], [5, 2, 2, "a"]]
    # item 1: a, a, b (one of two followers the same); item 2: b, b, a (one of two)
    assert same_instance_next(rows, 0) == (2, 4)
    assert same_instance_next(rows, 3) == (0, 1)  # from id 3 on: item 1 b alone; item 2 b then a


def test_summarize_counts_the_windows_under_a_fair_share_and_the_streak_of_each_round() -> None:
    # two 10 s windows: in the first, "c" makes 1 of 10 commits (under 20%); in the second every instance 4 of 12
    rounds = []
    for first in (0, 22):
        # each round's database holds the rounds before it too (the rows of 0..21 in the second): not counted again
        rows = [[i, 1, i, "a"] for i in range(first + 22)]
        commits = {"a": [1.0] * 5 + [11.0] * 4, "b": [1.0] * 4 + [11.0] * 4, "c": [1.0] + [11.0] * 4}
        rounds.append([_result(name, times, rows, first + 21) for name, times in commits.items()])
    figures = summarize(rounds)
    assert figures["windows"] == 4 and figures["windows_under"] == 2
    assert abs(figures["min_share"] - 0.1) < 1e-9
    assert figures["same_next"] == 1.0
