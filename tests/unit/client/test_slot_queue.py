"""SlotQueue: a partition's pending-append slots, handed out first come, first served, one waiter per freed slot."""

from __future__ import annotations

import pytest

from waltz_client.slot_queue import SlotQueue


def full_queue(capacity: int, waiters: int) -> SlotQueue[int]:
    """capacity slots all reserved, then `waiters` waiters 0, 1, ... arriving at t = 0, 1, ..."""
    slots: SlotQueue[int] = SlotQueue(capacity)
    for _ in range(capacity):
        assert slots.take(0)
    assert not slots.take(0)
    for w in range(waiters):
        slots.wait(w, float(w))
    return slots


def test_take_reserves_while_slots_are_free_counting_the_pending_appends() -> None:
    slots: SlotQueue[int] = SlotQueue(3)
    assert slots.take(1) and slots.take(1)
    assert not slots.take(1)  # 1 pending + 2 reserved
    slots.put_back()  # one became a pending append elsewhere, or gave up
    assert slots.take(1) and slots.reserved == 2


def test_a_new_submit_never_jumps_the_queue() -> None:
    slots = full_queue(2, 1)
    slots.put_back()  # a slot frees; the waiter is not granted yet
    assert slots.free(0)
    assert not slots.take(0)  # someone waits: the newcomer queues behind
    assert slots.grant(0) == [0]


def test_each_freed_slot_wakes_exactly_one_waiter_in_arrival_order() -> None:
    slots = full_queue(4, 1000)
    order = []
    for _ in range(1000):
        slots.put_back()  # one slot frees
        granted = slots.grant(0)
        assert len(granted) == 1  # one wake-up per freed slot, however many wait
        order.extend(granted)
    assert order == list(range(1000)) and len(slots) == 0 and slots.reserved == 4


def test_grant_hands_out_only_the_free_slots() -> None:
    slots = full_queue(4, 10)
    slots.put_back(3)
    assert slots.grant(0) == [0, 1, 2]
    assert slots.grant(0) == []
    slots.put_back(2)
    assert slots.grant(1) == [3]  # one of the two freed is taken by a pending append


def test_a_waiter_that_leaves_is_skipped_and_its_turn_passes_on() -> None:
    slots = full_queue(1, 4)
    assert slots.leave(1) and not slots.leave(1)
    assert len(slots) == 3
    slots.put_back()
    assert slots.grant(0) == [0]
    assert not slots.leave(0)  # granted: not waiting any more (the shell gives its slot back)
    slots.put_back()
    assert slots.grant(0) == [2]
    assert slots.leave(0) is False and len(slots) == 1


def test_retries_hold_a_slot_whatever_the_capacity_and_the_queue() -> None:
    slots = full_queue(2, 3)
    slots.hold()
    assert slots.reserved == 3
    slots.put_back()
    assert slots.grant(0) == []  # still full: the retry kept its place
    slots.put_back()
    assert slots.grant(0) == [0]


def test_time_outs_take_the_oldest_first_and_only_those_past_their_deadline() -> None:
    slots = full_queue(1, 5)  # arrived at 0..4
    assert slots.deadline(10.0) == 10.0
    assert slots.expire(9.5, 10.0) == []
    assert slots.expire(12.0, 10.0) == [0, 1, 2]
    assert slots.deadline(10.0) == 13.0
    slots.leave(3)
    assert slots.deadline(10.0) == 14.0  # a waiter that left does not hold a deadline
    assert slots.expire(20.0, 10.0) == [4]
    assert slots.deadline(10.0) is None and len(slots) == 0


def test_drain_fails_every_waiter_in_order() -> None:
    slots = full_queue(1, 4)
    slots.leave(2)
    assert slots.drain() == [0, 1, 3]
    assert len(slots) == 0 and slots.grant(0) == [] and slots.deadline(1.0) is None


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SlotQueue(0)
