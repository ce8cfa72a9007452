"""AppliedWaiters: the waits for a partition's client high-water mark (AsyncWaltzClient.wait_applied)."""

from __future__ import annotations

import asyncio

import pytest

from waltz_client import applied_waiters
from waltz_client.applied_waiters import AppliedWaiters


def test_a_mark_ends_the_waits_it_reaches_and_only_those() -> None:
    async def main() -> None:
        waiters = AppliedWaiters()
        five, three, again = waiters.wait(5), waiters.wait(3), waiters.wait(3)
        waiters.reached(2)
        assert not (five.done() or three.done())
        waiters.reached(4)
        assert three.done() and again.done() and not five.done()
        waiters.reached(9)
        assert five.done() and not waiters

    asyncio.run(main())


def test_a_failed_partition_ends_every_wait_now_and_later_with_its_error() -> None:
    async def main() -> None:
        waiters = AppliedWaiters()
        waiting = waiters.wait(1)
        error = RuntimeError("closed")
        waiters.fail(error)
        with pytest.raises(RuntimeError, match="closed"):
            await waiting
        with pytest.raises(RuntimeError, match="closed"):
            await waiters.wait(0)

    asyncio.run(main())


def test_waits_given_up_are_dropped_instead_of_kept_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(applied_waiters, "_PURGE_AT", 4)

    async def main() -> None:
        waiters = AppliedWaiters()
        for transaction_id in range(100):
            waiters.wait(10**6 + transaction_id).cancel()  # each timed out: nobody waits any more
        assert len(waiters._heap) <= 4
        kept = waiters.wait(10**7)
        waiters.reached(10**7)
        assert kept.done()

    asyncio.run(main())
