"""A store session torn down by a replica failure must not hand CancelledError to its callers."""

from __future__ import annotations

import asyncio

import pytest

from waltz_server.store.api import StoreUnavailable
from waltz_server.store.session_end import SessionFailed

from .fakes import FakeReplica
from .test_store_session import A, B, C, Harness, ended, pending, run, until


def test_a_session_ended_by_a_failed_replica_says_unavailable_and_not_restarting() -> None:
    """The run's task group cancelled the task awaiting the session's stop future, and with it the
    future itself: `restarting` (read by the store partition before every append) then raised
    CancelledError into the partition's append task, which ended silently and left the partition
    healthy but never appending again (found by tests/chaos: kill -9 of a storage node)."""

    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.pool.get(B).down()
            assert isinstance(await ended(task), SessionFailed)
            assert h.session.restarting is False  # an unplanned end
            assert not h.session.usable
            with pytest.raises(StoreUnavailable):
                await h.session.append(pending(1))

    run(test)


def test_while_the_session_tears_down_an_append_fails_with_a_store_error_not_cancelled_error() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.pool.get(B).down()
            outcomes: list[object] = []
            while not task.done():  # ask at every step of the teardown
                try:
                    outcomes.append(h.session.restarting)
                    await asyncio.wait_for(asyncio.shield(h.session.append(pending(1))), 0.001)
                except asyncio.CancelledError:
                    outcomes.append("CancelledError")
                    break
                except Exception as exc:  # any store error is a fine answer here
                    outcomes.append(type(exc).__name__)
                await asyncio.sleep(0)
            assert "CancelledError" not in outcomes, outcomes
            await ended(task)

    run(test)
