"""Partition lock semantics end to end: write, read and append locks, and in-flight conflicts."""

from __future__ import annotations

from waltz.v1 import server_pb2

from .fakes import Failure, FakeStream
from .harness import opened, run, settle
from .helpers import append, mount, req


async def mounted(*client_ids: int):
    partition, store = await opened()
    streams = {}
    for cid in client_ids:
        streams[cid] = FakeStream()
        partition.mount(streams[cid], mount(client_id=cid))
    return partition, store, streams


def test_write_write_conflict_answers_the_conflicting_transaction():
    async def scenario():
        partition, _, s = await mounted(1, 2)
        await partition.submit(s[1], [append(1, 1, write=(7,))])
        await s[1].wait_for(lambda st: len(st.fed()) == 1)
        await partition.submit(s[2], [append(2, 1, write=(7,), hwm=-1)])
        await s[2].wait_for(lambda st: st.of("lock_failure"))
        [failure] = s[2].of("lock_failure")
        assert failure.transaction_id == 0 and failure.req_id.client_id == 2
        await partition.submit(s[2], [append(2, 2, write=(7,), hwm=0)])  # caught up: allowed
        await s[2].wait_for(lambda st: len(st.fed()) == 2)
        assert partition.high_water_mark == 1
        await partition.close()

    run(scenario)


def test_read_after_write_conflicts_and_reads_are_not_recorded():
    async def scenario():
        partition, _, s = await mounted(1, 2, 3)
        await partition.submit(s[1], [append(1, 1, write=(7,))])
        await s[1].wait_for(lambda st: len(st.fed()) == 1)
        await partition.submit(s[2], [append(2, 1, read=(7,), hwm=-1)])
        await s[2].wait_for(lambda st: st.of("lock_failure"))
        assert s[2].of("lock_failure")[0].transaction_id == 0
        await partition.submit(s[2], [append(2, 2, read=(7,), hwm=0)])
        await s[2].wait_for(lambda st: len(st.fed()) == 2)
        # the read at id 1 recorded nothing: a writer that saw id 0 may still write lock 7
        await partition.submit(s[3], [append(3, 1, write=(7,), hwm=0)])
        await s[3].wait_for(lambda st: len(st.fed()) == 3)
        assert not s[3].of("lock_failure")
        await partition.close()

    run(scenario)


def test_append_locks_are_recorded_not_checked():
    async def scenario():
        partition, _, s = await mounted(1, 2, 3)
        await partition.submit(s[1], [append(1, 1, appends=(7,))])
        await partition.submit(s[2], [append(2, 1, appends=(7,), hwm=-1)])
        await s[2].wait_for(lambda st: len(st.fed()) == 2)
        assert not s[2].of("lock_failure")
        await partition.submit(s[3], [append(3, 1, write=(7,), hwm=0)])
        await s[3].wait_for(lambda st: st.of("lock_failure"))
        assert s[3].of("lock_failure")[0].transaction_id == 1
        await partition.close()

    run(scenario)


def test_conflict_with_in_flight_waits_for_its_outcome_without_holding_others():
    async def scenario():
        partition, store, s = await mounted(1, 2, 3)
        store.gate.clear()
        await partition.submit(s[1], [append(1, 1, write=(7,))])
        await settle()
        await partition.submit(s[2], [append(2, 1, write=(7,), hwm=-1)])
        await partition.submit(s[3], [append(3, 1, write=(8,), hwm=-1)])
        await settle()
        assert not s[2].of("lock_failure")  # waits: only the in-flight transaction's fate decides
        store.gate.set()
        await s[2].wait_for(lambda st: st.of("lock_failure"))
        assert s[2].of("lock_failure")[0].transaction_id == 0
        await s[3].wait_for(lambda st: len(st.fed()) == 2)
        assert [seq for _, seq in s[3].fed()] == [1, 1]  # client 1's then client 3's
        assert store.batches == [1, 1]
        await partition.close()

    run(scenario)


def test_an_append_doomed_by_an_in_flight_append_that_fails_gets_a_false_conflict():
    """Issue 31: an append whose lock an in-flight append holds leaves the queue (its client's later appends are not
    held behind it) and never commits: when the holder fails at the store it is answered LockFailure all the same,
    naming the partition's high-water mark (nothing to wait for: the client executes it again at once)."""
    async def scenario():
        partition, store, s = await mounted(1, 2)
        store.gate.clear()
        store.failures.append(Failure(commit=0))
        await partition.submit(s[1], [append(1, 1, write=(7,))])
        await settle()
        await partition.submit(s[2], [append(2, 1, write=(7,), hwm=-1)])
        await settle()
        store.gate.set()
        await s[2].wait_for(lambda st: bool(st.of("lock_failure")))
        failure = s[2].of("lock_failure")[0]
        assert failure.req_id.seq_num == 1 and failure.transaction_id == -1
        await settle()
        assert s[2].fed() == []
        await partition.close()

    run(scenario)


def test_a_waiting_append_keeps_its_clients_later_appends_behind_it():
    async def scenario():
        partition, store, s = await mounted(1, 2)
        store.gate.clear()
        await partition.submit(s[1], [append(1, 1, write=(7,))])
        await settle()
        await partition.submit(s[2], [append(2, 1, write=(7,), hwm=-1), append(2, 2, write=(9,), hwm=-1)])
        await settle()
        assert store.batches == []  # the first is still held at the gate
        store.gate.set()
        await s[2].wait_for(lambda st: len(st.fed()) == 2)
        assert s[2].of("lock_failure")[0].req_id.seq_num == 1
        assert s[2].fed() == [(0, 1), (1, 2)]  # client 2's second append went only after its first resolved
        await partition.close()

    run(scenario)


def test_a_flush_is_not_answered_before_an_earlier_append_at_the_store_when_a_later_one_fails_its_locks():
    """Issue 24's double commit after a ZooKeeper restart. The server held a client's appends while its connection
    was suspended and took them in one burst when it came back: one without locks went to the store; a later one
    with a lock failed its check at once; the client's flush (sent while it waited) came between them. The flush
    was answered when that lock failure made the count of resolved appends reach it, with the append at the store
    not yet committed: the client took it for failed, executed it again, and the log held it twice."""

    async def scenario():
        partition, store, s = await mounted(1, 2)
        await partition.submit(s[2], [append(2, 1, write=(7,))])
        await s[2].wait_for(lambda st: len(st.fed()) == 1)  # transaction 0 holds lock 7
        store.gate.clear()
        await partition.submit(s[1], [append(1, 1, data=b"at the store")])
        await settle()
        partition.flush(s[1], server_pb2.FlushRequest(req_id=req(1, 1)))
        await partition.submit(s[1], [append(1, 2, write=(7,), hwm=-1)])  # a stale read of lock 7
        await s[1].wait_for(lambda st: st.of("lock_failure"))
        await settle(50)
        assert not s[1].of("flush"), "a flush answered while an earlier append of the client was at the store"
        store.gate.set()
        await s[1].wait_for(lambda st: st.of("flush"))
        [flushed] = s[1].of("flush")
        assert flushed.transaction_id == 1 and (1, 1) in s[1].fed()
        await partition.close()

    run(scenario)


def test_a_doomed_appends_failure_follows_the_commit_that_failed_it_on_its_stream():
    """Issue 31: the failure went one stream write ahead of the feed, so every client but the committer's read each
    commit later, and the committer won the next round on the same lock 78-85% of the time. Now the feed comes
    first; a client with an append of its own among the commits hears its failure first (in order)."""
    async def scenario():
        partition, store, s = await mounted(1, 2)
        store.gate.clear()
        await partition.submit(s[1], [append(1, 1, write=(7,))])
        await settle()
        await partition.submit(s[2], [append(2, 1, write=(7,), hwm=-1)])
        await settle()
        store.gate.set()
        await s[2].wait_for(lambda st: bool(st.of("lock_failure")) and len(st.fed()) == 1)
        assert [m.WhichOneof("message") for m in s[2].messages if m.WhichOneof("message") != "mount"] == [
            "feed", "lock_failure"]
        await partition.close()

    run(scenario)
