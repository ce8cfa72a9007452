"""AppendPlacement: appends run on the loop only while one partition is busy and the node is quiet, with probes
on a stream read one request at a time (on_loop), without on one that hands its arrivals over (inline)."""

from __future__ import annotations

from waltz_storage.placement import SLOW_APPEND_S, SLOW_BACKOFF, AppendPlacement


def test_one_quiet_partition_runs_on_the_loop_but_for_a_probe_every_so_often():
    placement = AppendPlacement(probe_every=4)
    placed = [placement.on_loop(0, quiet=True) for _ in range(9)]
    # The first follows no append of its partition; then every fourth of a streak is a probe on the thread.
    assert placed == [False, True, True, True, False, True, True, True, False]


def test_an_overlapping_append_keeps_the_next_ones_on_the_thread_for_a_while():
    placement = AppendPlacement(probe_every=3)
    assert [placement.on_loop(0, quiet=True) for _ in range(2)] == [False, True]
    assert not placement.on_loop(0, quiet=False)  # a pipelining server: its appends overlap on the thread
    assert [placement.on_loop(0, quiet=True) for _ in range(4)] == [False, False, False, True]
    assert not placement.on_loop(0, quiet=False)
    assert [placement.on_loop(0, quiet=True) for _ in range(2)] == [False, False]
    assert not placement.on_loop(0, quiet=False)  # overlaps go on: so does the thread
    assert [placement.on_loop(0, quiet=True) for _ in range(6)] == [False, False, False, True, True, False]


def test_appends_of_several_partitions_in_turn_stay_on_their_threads():
    placement = AppendPlacement(probe_every=100)
    assert not any(placement.on_loop(p, quiet=True) for _ in range(10) for p in (0, 1))
    assert [placement.on_loop(0, quiet=True) for _ in range(2)] == [False, True]  # 0 after 1, then 0 after 0


def test_another_request_of_the_partition_restarts_the_streak():
    placement = AppendPlacement(probe_every=3)
    assert [placement.on_loop(0, quiet=True) for _ in range(2)] == [False, True]
    placement.elsewhere(0)  # e.g. a record list on the partition's thread
    assert [placement.on_loop(0, quiet=True) for _ in range(3)] == [True, True, False]
    placement.elsewhere(1)
    assert not placement.on_loop(0, quiet=True)


def test_a_slow_append_on_the_loop_sends_many_of_the_next_ones_to_the_thread():
    placement = AppendPlacement(probe_every=3)
    assert [placement.on_loop(0, quiet=True) for _ in range(2)] == [False, True]
    placement.took(SLOW_APPEND_S / 2)
    assert placement.on_loop(0, quiet=True)
    placement.took(SLOW_APPEND_S * 2)  # a struggling disk: the loop must not wait for it again soon
    placed = [placement.on_loop(0, quiet=True) for _ in range(SLOW_BACKOFF + 1)]
    assert not any(placed[:SLOW_BACKOFF]) and placed[SLOW_BACKOFF]
    placement.took(SLOW_APPEND_S * 2)
    assert not placement.on_loop(0, quiet=False)  # an overlap meanwhile does not shorten the wait
    assert not any(placement.on_loop(0, quiet=True) for _ in range(SLOW_BACKOFF - 1))


def test_appends_handed_over_as_they_arrive_run_on_the_loop_with_no_probe():
    """A stream that shows what has arrived (inline: the caller serves it as one run) needs no probe."""
    placement = AppendPlacement(probe_every=3)
    assert [placement.inline(0, idle=True) for _ in range(10)] == [False] + [True] * 9


def test_arrived_appends_keep_off_the_loop_while_a_thread_works_or_partitions_take_turns():
    placement = AppendPlacement()
    assert [placement.inline(0, idle=True) for _ in range(2)] == [False, True]
    assert not placement.inline(0, idle=False)  # another partition (or this one) has work on its thread
    assert placement.inline(0, idle=True)  # nothing to wait out: overlaps show as runs, not as a streak
    assert not any(placement.inline(p, idle=True) for _ in range(5) for p in (1, 0))
    assert not placement.inline(1, idle=True)
    assert [placement.inline(0, idle=True) for _ in range(2)] == [False, True]


def test_a_slow_run_on_the_loop_sends_the_next_ones_to_the_thread():
    placement = AppendPlacement()
    assert [placement.inline(0, idle=True) for _ in range(2)] == [False, True]
    placement.took(SLOW_APPEND_S * 2)
    placed = [placement.inline(0, idle=True) for _ in range(SLOW_BACKOFF + 1)]
    assert not any(placed[:SLOW_BACKOFF]) and placed[SLOW_BACKOFF]
