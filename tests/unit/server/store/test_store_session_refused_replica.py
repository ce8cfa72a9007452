"""A session whose replica keeps refusing (the partition is not on the node yet) must still end when asked.

Found in the chart's container test and reproduced with `waltz cluster provision` against a running
server: the replicas are assigned in ZooKeeper before the partitions exist on the nodes, every request
of the new sessions is refused with UNKNOWN_PARTITION, and each assignment write ends the session to
start the next one. Python 3.11's TaskGroup swallows a cancellation that reaches its task while it is
already aborting because a child failed; the replica task, which ran each attempt in a TaskGroup and
caught the group's errors to try again, lost the session's own cancellation that way, so the session
never finished ending: the partition stayed in an old session, without its newest replica, for ever.
"""

from __future__ import annotations

import asyncio
from typing import Any

from waltz.v1 import storage_pb2
from waltz_server.store.connection import Code, StorageRpcError
from waltz_server.store.session_end import SessionRestart

from .fakes import FakeReplica
from .test_store_session import A, B, C, Harness

HOPS = 12  # loop iterations between the refusal and the request to end: one of them lands in the window


class RefusingReplica(FakeReplica):
    """A node that does not hold the partition: every request is refused; on_refuse is told each time."""

    def __init__(self) -> None:
        super().__init__()
        self.on_refuse = lambda: None

    async def handle(self, kind: str, msg: Any) -> storage_pb2.StorageResponse:
        self.on_refuse()
        raise StorageRpcError(Code.UNKNOWN_PARTITION, f"partition {msg.partition_id} is not assigned here")


def later(hops: int, fn: Any) -> None:
    """Call fn after hops turns of the event loop."""
    loop = asyncio.get_running_loop()
    if hops == 0:
        fn()
    else:
        loop.call_soon(later, hops - 1, fn)


async def ends_when_asked(hops: int) -> str:
    """What became of a session asked to end hops loop turns after its first refusal."""
    refusing = RefusingReplica()
    h = Harness({A: refusing, B: FakeReplica(), C: FakeReplica()})

    def refused() -> None:
        refusing.on_refuse = lambda: None
        later(hops, lambda: h.session.request_end(SessionRestart("the replicas changed")))

    refusing.on_refuse = refused
    task = asyncio.create_task(h.session.run())
    done, _ = await asyncio.wait([task], timeout=2)
    if not done:
        return "still running 2 s after it was asked to end"
    return type(task.exception()).__name__


def test_a_session_asked_to_end_while_a_replica_is_refused_ends() -> None:
    outcomes = {}
    for hops in range(HOPS):
        # A loop of its own each: a session that never ends must not hang the test's teardown.
        loop = asyncio.new_event_loop()
        try:
            outcomes[hops] = loop.run_until_complete(ends_when_asked(hops))
        finally:
            loop.close()
    assert set(outcomes.values()) == {"SessionRestart"}, outcomes
