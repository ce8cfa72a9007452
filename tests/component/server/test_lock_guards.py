"""Raw gRPC appends that tried to get around the lock check (issue 24): a client high-water mark the log has not
reached, one below -1, and lock lists without bound. Each is refused INVALID with a reason; the stream and the
server go on."""

from __future__ import annotations

import pytest

from waltz.v1 import server_pb2

from .grpc_harness import served
from .harness import run
from .helpers import append, mount

Reason = server_pb2.AppendRejected.Reason
LOCK = 7


async def _with_one_lock_holder(s):
    """A stream of client 1 mounted on partition 0, where transaction 0 (client 2's) holds write lock LOCK."""
    holder = s.open_stream()
    await holder.send(mount=mount(client_id=2))
    await holder.receive_until(lambda h: h.of("mount"))
    await holder.send(appends=server_pb2.AppendBatch(requests=[append(client_id=2, seq=1, write=(LOCK,))]))
    await holder.receive_until(lambda h: len(h.fed()) == 1)
    stream = s.open_stream()
    await stream.send(mount=mount())
    await stream.receive_until(lambda h: h.of("mount") and h.fed())
    return stream


@pytest.mark.parametrize("above", [1, 1000, 2**53])
@pytest.mark.parametrize("kind", ["write", "read"])
def test_a_client_high_water_mark_above_the_log_is_refused_not_committed_unchecked(above: int, kind: str) -> None:
    async def scenario() -> None:
        async with served() as s:
            stream = await _with_one_lock_holder(s)
            locks = {kind: (LOCK,)}
            stale = append(seq=1, hwm=-1, **locks)  # the honest stale read: a lock failure
            claimed = append(seq=2, hwm=0 + above, **locks)  # the log's high-water mark is 0
            await stream.send(appends=server_pb2.AppendBatch(requests=[stale, claimed]))
            await stream.receive_until(lambda h: h.of("lock_failure") and h.of("append_rejected"))
            [failure] = stream.of("lock_failure")
            assert failure.req_id.seq_num == 1 and failure.transaction_id == 0
            [rejected] = stream.of("append_rejected")
            assert rejected.req_id.seq_num == 2 and rejected.reason == Reason.INVALID
            assert f"client_high_water_mark {above}" in rejected.message and "above" in rejected.message
            assert s.manager.get(0).high_water_mark == 0  # nothing committed
            # the same client goes on with an honest mark
            await stream.send(appends=server_pb2.AppendBatch(requests=[append(seq=3, hwm=0, **locks)]))
            await stream.receive_until(lambda h: len(h.fed()) == 2)
            await stream.call.done_writing()

    run(scenario)


def test_a_client_high_water_mark_below_minus_one_is_refused() -> None:
    async def scenario() -> None:
        async with served() as s:
            stream = await _with_one_lock_holder(s)
            await stream.send(appends=server_pb2.AppendBatch(requests=[append(seq=1, hwm=-2, write=(LOCK,))]))
            await stream.receive_until(lambda h: h.of("append_rejected"))
            [rejected] = stream.of("append_rejected")
            assert rejected.reason == Reason.INVALID and "below -1" in rejected.message
            await stream.call.done_writing()

    run(scenario)


def test_an_append_with_more_locks_than_the_limit_is_refused_at_once_and_leaves_the_table_alone() -> None:
    async def scenario() -> None:
        async with served() as s:
            stream = await _with_one_lock_holder(s)
            limit = s.manager.get(0).settings.max_locks_per_append  # GetClusterInfo's limits tell clients
            assert limit == 256
            flood = append(seq=1, hwm=0, write=tuple(range(1000, 1000 + 1_000_000)))
            await stream.send(appends=server_pb2.AppendBatch(requests=[flood]))
            await stream.receive_until(lambda h: h.of("append_rejected"))
            [rejected] = stream.of("append_rejected")
            assert rejected.reason == Reason.INVALID and "1000000 locks" in rejected.message
            # exactly the limit is fine, and unrelated locks with an older mark do not fail against it
            at_limit = append(seq=2, hwm=0, write=tuple(range(5000, 5000 + limit)))
            unrelated = append(seq=3, hwm=0, write=(99,))
            await stream.send(appends=server_pb2.AppendBatch(requests=[at_limit, unrelated]))
            await stream.receive_until(lambda h: len(h.fed()) == 3)
            assert not stream.of("lock_failure")
            await stream.call.done_writing()

    run(scenario)
