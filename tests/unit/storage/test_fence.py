"""SessionFence: lower sessions are refused once a higher one was seen."""

import pytest

from waltz_storage.errors import StaleSession
from waltz_storage.fence import SessionFence


def test_fence_admits_same_and_higher_and_refuses_lower():
    fence = SessionFence(partition_id=3, highest_session_id=5)
    fence.check(5)
    with pytest.raises(StaleSession, match="stale session 4, partition 3 is at session 5"):
        fence.check(4)
    fence.check(9)
    assert fence.highest_session_id == 5  # issue 25: a check (a read, an append) never raises the fence
    fence.check(10**12)
    fence.check(4 + 1)
    fence.advance(9)  # a SetLowWaterMark does
    assert fence.highest_session_id == 9
    with pytest.raises(StaleSession, match="stale session 5, partition 3 is at session 9"):
        fence.check(5)
    fence.check(9)


def test_fresh_fence_admits_anything_then_fences():
    fence = SessionFence(0)
    assert fence.highest_session_id == -1
    fence.check(0)
    fence.check(-1)
    fence.advance(0)
    with pytest.raises(StaleSession):
        fence.check(-1)
    with pytest.raises(StaleSession):
        fence.advance(-1)


def test_a_reset_fence_goes_back():
    fence = SessionFence(1, highest_session_id=10**12)
    fence.reset(7)
    assert fence.highest_session_id == 7
    fence.check(7)
