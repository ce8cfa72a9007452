"""SequenceWindow: strictly increasing sequence numbers (serial arithmetic), the re-send window, bounded memory."""

from __future__ import annotations

import pytest

from waltz_server.sequences import Resend, SequenceWindow, is_after

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


def test_only_numbers_after_the_last_one_are_admitted():
    w = SequenceWindow(10)
    assert w.admit(1, 1000)
    assert not w.admit(1, 7) and not w.admit(1, -5) and not w.admit(1, 1000)
    assert w.admit(1, 1001) and w.admit(1, 5000)
    assert w.admit(2, -5)  # per client: another client starts anywhere


def test_numbers_wrap_from_int32_max_to_int32_min():
    assert is_after(INT32_MAX, INT32_MIN) and not is_after(INT32_MIN, INT32_MAX)
    assert is_after(-1, 0) and not is_after(0, 2**31)  # half the circle away is not after
    w = SequenceWindow(10)
    assert w.admit(1, INT32_MAX - 1) and w.admit(1, INT32_MAX) and w.admit(1, INT32_MIN) and w.admit(1, INT32_MIN + 1)
    assert not w.admit(1, INT32_MAX)


def test_a_committed_number_is_found_while_in_the_window():
    w = SequenceWindow(3)
    for seq in (1, 2, 3, 4):
        assert w.admit(1, seq)
    for entry in [(1, 1, 10), (1, 2, 11), (1, 3, 12)]:
        w.record(entry)
    assert w.classify(1, 2) == Resend(4, 11)
    w.record((1, 4, 13))  # seq 1 leaves the window
    assert w.classify(1, 1) == Resend(4, None)
    assert w.classify(1, 4) == Resend(4, 13)
    assert w.classify(2, 4) == Resend(4, None)  # a client the window does not know


def test_rebuild_from_the_log_tail_takes_each_clients_last_number():
    w = SequenceWindow(100)
    w.rebuild([(1, 5, 0), (2, INT32_MAX, 1), (1, 6, 2), (2, INT32_MIN, 3)])
    assert len(w) == 4 and w.last == {1: 6, 2: INT32_MIN}
    assert not w.admit(1, 6) and w.classify(1, 6) == Resend(6, 2)
    assert w.admit(2, INT32_MIN + 1)


def test_memory_stays_bounded_by_the_window():
    w = SequenceWindow(5)
    for client in range(1000):
        w.admit(client, 1)
        w.record((client, 1, client))
        w.forget_silent(lambda c: c == 3)
    assert len(w) == 5
    assert len(w.last) <= 2 * 5 + 1
    assert 3 in w.last and 999 in w.last


def test_the_window_holds_at_least_one_transaction():
    with pytest.raises(ValueError):
        SequenceWindow(0)
