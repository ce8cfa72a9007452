"""StoreSession over in-memory replicas: recovery driven through the core, quorum appends, catch-up, reads."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from waltz_common.types import ReqId, crc32
from waltz_server.recovery import UNRESOLVED, ReplicaState
from waltz_server.store.api import AppendFailed, NewRecord, PendingRecord, StoreUnavailable
from waltz_server.store.metadata import SessionStart
from waltz_server.store.session_end import SessionEnded, SessionFailed, SessionFenced, SessionRestart
from waltz_server.store.settings import StoreSettings
from waltz_server.store.store_session import StoreSession
from waltz_server.validation import req_id_message

from .fakes import FakeConnections, FakeReplica

FAST = StoreSettings(initial_retry_interval_s=0.01, max_retry_interval_s=0.05, catch_up_batch_size=3)
A, B, C = "a:1", "b:1", "c:1"


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(30):
            await test()

    asyncio.run(bounded())


def pending(count: int, tag: str = "p") -> list[PendingRecord]:
    return [
        NewRecord(req_id_message(ReqId(2, 1, 0, i)), 0, f"{tag}{i}".encode(), crc32(f"{tag}{i}".encode()))
        for i in range(count)
    ]


class Harness:
    def __init__(
        self,
        replicas: dict[str, FakeReplica],
        *,
        offline: tuple[str, ...] = (),
        session_id: int = 0,
        previous: Mapping[str, ReplicaState] | None = None,
        settings: StoreSettings = FAST,
    ) -> None:
        self.replicas = replicas
        self.pool = FakeConnections(replicas, offline)
        self.written: list[dict[str, ReplicaState]] = []
        start = SessionStart(0, 1, session_id, previous or {}, version=0)
        self.session = StoreSession(start, replicas, self.pool.as_pool(), settings, self._write)

    async def _write(self, states: Mapping[str, ReplicaState]) -> None:
        self.written.append(dict(states))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        task = asyncio.create_task(self.session.run())
        try:
            yield task
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, SessionEnded):
                await task

    def log(self, replica: str) -> list[bytes]:
        return [r.data for r in self.replicas[replica].records]


async def until(predicate: Callable[[], Any]) -> None:
    while not predicate():
        await asyncio.sleep(0.005)


async def ended(task: asyncio.Task[None]) -> SessionEnded:
    with pytest.raises(SessionEnded) as info:
        await task
    return info.value


def in_session(session_id: int, *replicas: str) -> dict[str, ReplicaState]:
    return {r: ReplicaState(session_id, UNRESOLVED) for r in replicas}


def test_fresh_replicas_open_at_minus_one_and_an_append_commits_at_a_majority() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await h.session.ready.wait()
            assert h.session.high_water_mark == -1
            await until(lambda: len(h.session.members) == 3)
            assert h.written[-1] == in_session(0, A, B, C)
            h.replicas[C].hold_appends = True
            assert await h.session.append(pending(3)) == 0  # A and B acknowledged; C has not answered yet
            assert h.session.high_water_mark == 2 and h.log(A) == h.log(B) == [b"p0", b"p1", b"p2"]
            assert h.log(C) == []
            h.replicas[C].release()
            await h.session.drain()
            assert h.log(C) == h.log(A)
            assert await h.session.append(pending(1, "q")) == 3

    run(test)


def test_a_session_gives_back_every_connection_it_took_when_it_ends() -> None:
    # so that the pool can close a storage node's connection once no session uses it
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()}, offline=(C,))
        async with h.running():
            await until(lambda: len(h.session.members) == 2)
            assert h.pool.users == {A: 1, B: 1, C: 1}
        assert h.pool.users == {A: 0, B: 0, C: 0}

    run(test)


def test_a_member_lost_during_an_append_without_quorum_fails_it_and_ends_the_session() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.replicas[B].hold_appends = h.replicas[C].hold_appends = True
            append = asyncio.create_task(h.session.append(pending(2)))
            await until(lambda: len(h.log(A)) == 2)
            h.pool.get(C).down()
            with pytest.raises(AppendFailed) as failure:
                await append
            assert failure.value.first_transaction_id == 0 and failure.value.committed_up_to is None
            assert isinstance(await ended(task), SessionFailed)
            with pytest.raises(StoreUnavailable):
                await h.session.append(pending(1))

    run(test)


def test_an_idle_member_lost_ends_the_session() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.pool.get(B).down()
            reason = await ended(task)
            assert isinstance(reason, SessionFailed) and B in str(reason)

    run(test)


def test_storage_fencing_a_newer_session_ends_this_one_as_fenced() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            for replica in h.replicas.values():
                replica.fence = 1  # another server's session 1 has talked to every replica
            with pytest.raises(AppendFailed):
                await h.session.append(pending(1))
            assert isinstance(await ended(task), SessionFenced)

    run(test)


def test_a_dirty_tail_above_the_majority_is_truncated_and_states_are_written() -> None:
    async def test() -> None:
        replicas = {A: FakeReplica(6, 0, -1), B: FakeReplica(4, 0, -1), C: FakeReplica(4, 0, -1)}
        h = Harness(replicas, session_id=1, previous=in_session(0, A, B, C))
        async with h.running():
            await h.session.ready.wait()
            assert h.session.high_water_mark == 4
            await until(lambda: len(h.session.members) == 3)
            assert replicas[A].max_transaction_id == 4
            assert all(r.session_id == 1 and r.low_water_mark == 4 for r in replicas.values())
            assert h.written[-1] == in_session(1, A, B, C)

    run(test)


def test_undecidable_waits_and_a_returning_replica_follows_the_usher_until_decidable() -> None:
    async def test() -> None:
        replicas = {A: FakeReplica(5, 0, -1), B: FakeReplica(3, 0, -1), C: FakeReplica(1, 0, -1)}
        h = Harness(replicas, offline=(B, C), session_id=1, previous=in_session(0, A, B, C))
        async with h.running():
            await asyncio.sleep(0.2)
            assert not h.session.ready.is_set() and "undecidable" in h.session.describe()
            h.pool.get(B).up()  # 5 has one vote, 3 has two, but C could still vote for 5: B copies 4..5 from A
            await h.session.ready.wait()
            assert h.session.high_water_mark == 5 and h.log(B) == h.log(A)
            assert h.written[0][C] == ReplicaState(0, 5)  # C, offline, keeps its session with the closing mark
            assert await h.session.append(pending(1)) == 6
            h.pool.get(C).up()
            await until(lambda: len(h.session.members) == 3)
            assert h.log(C) == h.log(A) and h.written[-1] == in_session(1, A, B, C)

    run(test)


def test_a_lagging_replica_catches_up_from_the_write_set_while_appends_go_on_and_then_joins() -> None:
    async def test() -> None:
        replicas = {A: FakeReplica(9, 0, -1), B: FakeReplica(9, 0, -1), C: FakeReplica(4, 0, -1)}
        h = Harness(replicas, offline=(C,), session_id=1, previous=in_session(0, A, B, C))
        async with h.running():
            await h.session.ready.wait()
            assert h.session.members == (A, B) and h.session.high_water_mark == 9
            for i in range(4):
                await h.session.append(pending(2, f"x{i}-"))
            h.pool.get(C).up()
            for i in range(4):
                await h.session.append(pending(2, f"y{i}-"))
            await until(lambda: len(h.session.members) == 3)
            await h.session.append(pending(1, "z"))
            await h.session.drain()
            assert len(h.log(A)) == 27 and h.log(A) == h.log(B) == h.log(C)

    run(test)


def test_reads_are_clamped_to_the_high_water_mark_and_fall_back_to_another_member() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await until(lambda: len(h.session.members) == 3)
            await h.session.append(pending(5))
            await h.session.drain()
            h.replicas[A].fail_reads = True
            h.replicas[B].records.append(h.replicas[B].records[-1])  # beyond the mark: never served
            got = await h.session.records(3, 10)
            assert [r.transaction_id for r in got] == [3, 4] and got[0].data == b"p3"
            assert [x.transaction_id for x in await h.session.headers(0, 2)] == [0, 1]
            assert await h.session.records(5, 1) == []
            h.replicas[B].max_list = 2
            assert [r.transaction_id for r in await h.session.records(0, 5)] == [0, 1, 2, 3, 4]
            for replica in h.replicas.values():
                replica.fail_reads = True
            with pytest.raises(StoreUnavailable):
                await h.session.records(0, 1)

    run(test)


def test_the_checkpoint_interval_ends_the_session_as_a_planned_restart() -> None:
    async def test() -> None:
        settings = StoreSettings(initial_retry_interval_s=0.01, max_retry_interval_s=0.05, checkpoint_interval=4)
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()}, settings=settings)
        async with h.running() as task:
            await h.session.ready.wait()
            await h.session.append(pending(3))
            assert h.session.usable
            await h.session.append(pending(2))
            await until(lambda: h.session.restarting)
            assert not h.session.appendable
            with pytest.raises(StoreUnavailable):
                await h.session.begin_append(pending(1))
            assert isinstance(await ended(task), SessionRestart)

    run(test)


def test_a_slow_member_holds_appends_back_past_its_backlog_bytes_not_a_count_of_batches() -> None:
    async def test() -> None:
        # room for three one-record batches at the slow member (a request is a few dozen bytes beyond its data)
        bound = dataclasses.replace(FAST, max_replica_backlog_bytes=3 * 60)
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()}, settings=bound)
        async with h.running():
            await until(lambda: len(h.session.members) == 3)
            h.replicas[C].hold_appends = True
            sent = 0
            while h.session._writes.has_room():
                assert await h.session.append(pending(1, f"b{sent}")) == sent
                sent += 1
            assert 1 <= sent <= 4, sent  # bounded by bytes
            blocked = asyncio.create_task(h.session.append(pending(1, "late")))
            await asyncio.sleep(0.1)
            assert not blocked.done() and len(h.log(A)) == sent
            h.replicas[C].release()
            assert await blocked == sent
            await h.session.drain()
            assert h.log(C) == h.log(A)

    run(test)


def test_many_small_batches_go_to_a_member_behind_the_quorum() -> None:
    """More than the 8 batches the window used to hold: a replica a round trip behind (far away) has that many
    small batches out all the time when appends come one by one; the quorum of the others commits them."""

    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await until(lambda: len(h.session.members) == 3)
            h.replicas[C].hold_appends = True
            for i in range(40):
                assert await h.session.append(pending(1, f"b{i}")) == i
            h.replicas[C].release()
            await h.session.drain()
            assert h.log(C) == h.log(A) and len(h.log(A)) == 40

    run(test)


def test_a_batch_larger_than_the_backlog_bound_still_goes() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()},
                    settings=dataclasses.replace(FAST, max_replica_backlog_bytes=1))
        async with h.running():
            await until(lambda: len(h.session.members) == 3)
            assert await h.session.append(pending(3, "big")) == 0
            assert await h.session.append(pending(2, "next")) == 3

    run(test)


def test_a_member_behind_the_quorum_for_the_lag_timeout_ends_the_session_without_it() -> None:
    async def test() -> None:
        lag = dataclasses.replace(FAST, replica_lag_timeout_s=0.2)
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()}, settings=lag)
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.replicas[C].hold_appends = True  # connected, but it never answers: a hung disk or process
            assert await h.session.append(pending(1)) == 0  # A and B are the quorum
            reason = await ended(task)
            assert isinstance(reason, SessionFailed) and C in str(reason) and "behind the quorum" in str(reason)
            assert h.log(A) == h.log(B) and len(h.log(A)) == 1

    run(test)


def test_a_member_that_does_not_answer_an_append_within_the_request_timeout_ends_the_session() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.pool.connections[C].request_timeout_s = 0.3
            h.replicas[C].hold_appends = True
            assert await h.session.append(pending(1)) == 0  # A and B are the quorum
            started = asyncio.get_running_loop().time()
            assert await h.session.append(pending(1, "q")) == 1  # its turn comes only after the first's
            reason = await ended(task)
            waited = asyncio.get_running_loop().time() - started
            assert isinstance(reason, SessionFailed) and C in str(reason) and "no answer within 0.3 s" in str(reason)
            assert 0.2 < waited < 5

    run(test)


def test_a_member_answering_each_append_within_the_request_timeout_stays_however_long_it_is_busy() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.pool.connections[C].request_timeout_s = 0.3
            for i in range(6):  # C always has an append unanswered, for 1 s in all, each answered within 0.2 s
                h.replicas[C].hold_appends = True
                assert await h.session.append(pending(1, f"t{i}")) == i
                await asyncio.sleep(0.15)
                h.replicas[C].release()
                await until(lambda: h.log(C) == h.log(A))
            await h.session.drain()
            assert not task.done() and len(h.session.members) == 3 and h.log(C) == h.log(A)

    run(test)


def test_a_member_that_answers_within_the_lag_timeout_stays_in_the_session() -> None:
    async def test() -> None:
        lag = dataclasses.replace(FAST, replica_lag_timeout_s=0.4)
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()}, settings=lag)
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.replicas[C].hold_appends = True
            assert await h.session.append(pending(1)) == 0
            await asyncio.sleep(0.2)
            h.replicas[C].release()
            await h.session.drain()
            await asyncio.sleep(0.4)  # past the lag timeout since the quorum: nothing is outstanding now
            assert not task.done() and h.session.usable and h.log(C) == h.log(A)

    run(test)

async def hold_appends_everywhere(h: Harness) -> None:
    """Once all three replicas are in the write set, none of them answers appends (until released)."""
    await until(lambda: len(h.session.members) == 3)
    for replica in h.replicas.values():
        replica.hold_appends = True


def test_a_cancelled_wait_leaves_the_batch_to_commit_in_the_same_session() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await hold_appends_everywhere(h)
            append = asyncio.create_task(h.session.append(pending(1)))
            await asyncio.sleep(0.05)
            append.cancel()
            for replica in h.replicas.values():
                replica.release()
            await h.session.drain()
            assert h.session.usable and h.session.high_water_mark == 0
            assert await h.session.append(pending(1, "q")) == 1

    run(test)


def test_batches_begun_together_are_pipelined_and_commit_in_order_with_dense_ids() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await hold_appends_everywhere(h)
            commits = [await h.session.begin_append(pending(n, f"b{n}-")) for n in (2, 1, 3)]
            await asyncio.sleep(0.05)
            # all three batches are at the replicas at once, none answered
            assert not any(c.done() for c in commits) and h.session.high_water_mark == -1
            order: list[int] = []
            for c in commits:
                c.add_done_callback(lambda f: order.append(f.result()))
            h.replicas[A].release()
            h.replicas[C].release()
            assert [await c for c in commits] == [0, 2, 3]
            await asyncio.sleep(0)  # the done callbacks of the last one
            assert order == [0, 2, 3] and h.session.high_water_mark == 5
            assert h.log(A) == h.log(C) == [b"b2-0", b"b2-1", b"b1-0", b"b3-0", b"b3-1", b"b3-2"]
            h.replicas[B].release()
            await h.session.drain()
            assert h.log(B) == h.log(A)

    run(test)


def test_a_member_lost_with_batches_in_flight_fails_every_one_of_them() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running() as task:
            await until(lambda: len(h.session.members) == 3)
            h.replicas[B].hold_appends = h.replicas[C].hold_appends = True
            commits = [await h.session.begin_append(pending(2, f"b{i}-")) for i in range(3)]
            await until(lambda: len(h.log(A)) == 6)
            h.pool.get(C).down()
            for i, commit in enumerate(commits):
                with pytest.raises(AppendFailed) as failure:
                    await commit
                assert failure.value.first_transaction_id == 2 * i and failure.value.committed_up_to is None
            assert isinstance(await ended(task), SessionFailed)

    run(test)
