"""AppendPipeline and ClientPending: lock outcomes, in-flight waits, ordering, batching, resolution."""

from __future__ import annotations

import random
from dataclasses import dataclass

from waltz_server.append_pipeline import AppendPipeline, ClientPending, QueuedAppend, Send
from waltz_server.locks import LockRequest, LockTable


def item(client: int, name: str, hwm: int = -1, write=(), read=(), append=(), size: int = 1) -> QueuedAppend[str]:
    return QueuedAppend(client, hwm, LockRequest(tuple(write), tuple(read), tuple(append)), size, name)


def names(items) -> list[str]:
    return [i.origin for i in items]


def pipeline(max_count: int = 100, max_bytes: int = 10_000) -> AppendPipeline[str]:
    return AppendPipeline(LockTable(-1, 1000), max_count, max_bytes)


def test_appends_are_batched_in_order_with_one_batch_in_flight():
    p = pipeline()
    for n in "abc":
        p.offer(item(1, n))
    assert p.poll() == []
    assert names(p.take_batch()) == ["a", "b", "c"]
    p.offer(item(1, "d"))
    p.poll()
    assert p.take_batch() is None  # one batch at the store at a time
    resolved = p.committed(0)
    assert [(i.origin, t) for i, t in resolved.committed] == [("a", 0), ("b", 1), ("c", 2)]
    assert names(p.take_batch()) == ["d"]


def test_batch_limits_by_count_and_bytes():
    p = pipeline(max_count=2, max_bytes=10)
    for n in "abcde":
        p.offer(item(ord(n), n, size=4))
    p.poll()
    assert names(p.take_batch()) == ["a", "b"]
    p.committed(0)
    p.poll()
    assert names(p.take_batch()) == ["c", "d"]
    p.committed(2)
    p.offer(item(9, "big", size=50))  # alone it may exceed the byte bound
    p.poll()
    assert names(p.take_batch()) == ["e", "big"][:1]
    p.committed(4)
    p.poll()
    assert names(p.take_batch()) == ["big"]


def test_committed_write_lock_fails_a_stale_writer_and_reader():
    p = pipeline()
    p.offer(item(1, "w", write=[7]))
    p.poll()
    p.take_batch()
    p.committed(0)
    p.offer(item(2, "stale-w", write=[7]))
    p.offer(item(3, "stale-r", read=[7]))
    p.offer(item(4, "fresh", hwm=0, write=[7]))
    failures = p.poll()
    assert [(i.origin, t) for i, t in failures] == [("stale-w", 0), ("stale-r", 0)]
    assert names(p.take_batch()) == ["fresh"]


def test_in_flight_conflict_waits_and_unrelated_appends_pass():
    p = pipeline()
    p.offer(item(1, "a", write=[9]))
    p.poll()
    p.take_batch()
    p.offer(item(2, "b", write=[7], append=[9]))  # meets in-flight a's lock 9 (its append lock: not doomed)
    p.offer(item(2, "b2"))  # same client as b: stays behind it
    p.offer(item(3, "c", read=[7]))  # touches b's lock: stays behind it
    p.offer(item(4, "d", write=[8]))
    assert p.poll() == []
    assert p.waiting == 3
    resolved = p.committed(0)
    assert resolved.lock_failures == [] and p.poll() == []
    assert names(p.take_batch()) == ["d", "b", "b2"]  # d was batched meanwhile; c waits for b (its lock 7)


def test_an_append_doomed_by_an_in_flight_lock_leaves_the_queue_and_fails_with_its_commit():
    """Issue 31: an append waiting behind another client's in-flight transaction on the same lock held every later
    append of its client (on other locks too) until that commit, which then failed it anyway."""
    p = pipeline()
    p.offer(item(1, "a", write=[7]))
    p.poll()
    p.take_batch()  # in flight, holding lock 7
    p.offer(item(2, "b", write=[7]))  # doomed: a's commit fails it
    p.offer(item(2, "b2", write=[8]))  # same client as b: no longer behind it
    p.offer(item(3, "c", read=[7]))  # a reader of lock 7: doomed as well
    p.offer(item(3, "c2", write=[8]))  # meets b2's lock 8 (building): waits
    assert p.poll() == []
    assert p.waiting == 1 and p.doomed == 2 and len(p) == 5
    assert p.take_batch() is None  # one batch in flight
    resolved = p.committed(0)
    assert names(i for i, _ in resolved.committed) == ["a"]
    assert [(i.origin, t) for i, t in resolved.lock_failures] == [("b", 0), ("c", 0)]
    assert p.doomed == 0
    assert names(p.take_batch()) == ["b2"]  # c2 now meets in-flight b2's lock 8: doomed
    assert p.poll() == [] and p.doomed == 1
    assert [(i.origin, t) for i, t in p.committed(1).lock_failures] == [("c2", 1)]
    assert len(p) == 0


def test_a_doomed_appends_failure_goes_after_the_feed_unless_its_client_has_an_append_among_the_commits():
    """Issue 31: every client but the committer's read each commit one stream write after its lock failure (3.5 ms
    at p50), and the committer made 78-85% of the next commits on the same item. Its client's own commits in the
    batch are heard after the failure (in order); other clients' failures go after the feed."""
    p = pipeline()
    p.offer(item(1, "a", write=[7]))
    p.offer(item(2, "x", write=[9]))
    p.poll()
    p.take_batch()  # a and x in flight, holding locks 7 and 9
    p.offer(item(2, "b", write=[7]))  # doomed; its client's x commits in the same batch
    p.offer(item(3, "c", write=[7]))  # doomed; nothing of client 3 commits
    p.poll()
    resolved = p.committed(0)
    before, after = resolved.answer_order()
    assert [(i.origin, t) for i, t in before] == [("b", 0)]
    assert [(i.origin, t) for i, t in after] == [("c", 0)]
    assert resolved.answer_order() == (before, after)


def test_a_doomed_append_fails_also_when_its_holder_fails_and_a_drop_takes_it():
    p = pipeline()
    p.offer(item(1, "a", write=[7]))
    p.poll()
    p.take_batch()
    p.offer(item(2, "b", write=[7]))
    p.offer(item(3, "c", write=[7]))
    p.poll()
    assert p.doomed == 2
    assert names(p.drop(lambda i: i.client_id == 3)) == ["c"]
    assert p.doomed == 1 and len(p) == 2
    resolved = p.failed(4, 3)  # a never committed: b fails all the same (a false conflict), never commits
    assert names(resolved.failed) == ["a"] and [(i.origin, t) for i, t in resolved.lock_failures] == [("b", 3)]
    assert len(p) == 0 and p.poll() == [] and p.take_batch() is None


def test_only_the_same_lock_dooms_an_append_not_a_shared_slot() -> None:
    """A lock that only shares a table slot with an in-flight one may still pass once that commits: it waits."""
    locks = LockTable(-1, 1)  # one slot: every lock shares it
    p: AppendPipeline[str] = AppendPipeline(locks, 100, 10_000)
    p.offer(item(1, "a", write=[7]))
    p.poll()
    p.take_batch()
    p.offer(item(2, "b", write=[8]))
    assert p.poll() == [] and p.waiting == 1 and p.doomed == 0


def test_in_flight_failure_lets_the_waiting_conflict_go():
    p: AppendPipeline[str] = AppendPipeline(LockTable(-1, 1), 100, 10_000)  # one slot: locks 7 and 8 share it
    p.offer(item(1, "a", write=[7]))
    p.poll()
    p.take_batch()
    p.offer(item(2, "b", write=[8]))  # waits (a shared slot, not a's lock: not doomed)
    p.poll()
    resolved = p.failed(0, -1)
    assert names(resolved.failed) == ["a"] and resolved.committed == []
    assert p.poll() == []
    assert names(p.take_batch()) == ["b"]


def test_partial_failure_commits_the_prefix_and_records_its_locks():
    p = pipeline()
    p.offer(item(1, "a", write=[1]))
    p.offer(item(2, "b", write=[2]))
    p.offer(item(3, "c", write=[3]))
    p.poll()
    p.take_batch()
    resolved = p.failed(5, 5)
    assert [(i.origin, t) for i, t in resolved.committed] == [("a", 5)]
    assert names(resolved.failed) == ["b", "c"]
    p.offer(item(4, "x", hwm=4, write=[1]))
    p.offer(item(4, "y", hwm=4, write=[2]))
    assert [i.origin for i, _ in p.poll()] == ["x"]
    assert len(p) == 1


def test_drop_removes_waiting_and_batched_but_not_in_flight():
    p = pipeline()
    p.offer(item(1, "a", write=[7]))
    p.poll()
    p.take_batch()
    p.offer(item(2, "b", write=[7]))
    p.offer(item(3, "c", write=[9]))
    p.poll()
    assert names(p.drop(lambda i: True)) == ["c", "b"]  # batched c, then doomed b
    assert len(p) == 1 and p.in_flight
    p.committed(0)
    p.offer(item(5, "d", hwm=0, write=[9]))  # c's lock was released by the drop
    assert p.poll() == [] and names(p.take_batch()) == ["d"]


def test_client_pending_flush_waiters_fire_in_order():
    pending: ClientPending[str] = ClientPending()
    assert pending.add_waiter(1, "nothing pending") is True
    first, second = pending.offered(1), pending.offered(1)
    assert pending.add_waiter(1, "after two") is False
    third = pending.offered(1)
    assert pending.add_waiter(1, "after three") is False
    assert pending.resolved(1, first) == []
    assert pending.resolved(1, second) == ["after two"]
    assert pending.pending(1) == 1
    assert pending.resolved(1, third) == ["after three"]
    assert pending.pending(1) == 0
    pending.offered(1)
    assert pending.add_waiter(1, "again") is False
    assert pending.drop_waiters() == ["again"]


def test_client_pending_resolves_several_appends_at_once():
    pending: ClientPending[str] = ClientPending()
    tickets = [pending.offered(1) for _ in range(5)]
    assert pending.add_waiter(1, "after five") is False
    other = pending.offered(2)
    assert pending.add_waiter(2, "client two") is False
    assert [w for t in tickets[:3] for w in pending.resolved(1, t)] == []
    assert pending.pending(1) == 2
    assert [w for t in tickets[3:] for w in pending.resolved(1, t)] == ["after five"]
    assert pending.pending(1) == 0 and pending.pending(2) == 1
    assert pending.resolved(2, other) == ["client two"]


def test_a_flush_waits_for_an_earlier_append_when_a_later_one_resolves_first():
    """Issue 24: a later append with locks fails its lock check at once while an earlier one without locks is at the
    store. Counting resolutions answered the flush between them then: the client took the earlier append for failed
    (not in the feed up to the flush's high-water mark) and executed it again, and both attempts committed."""
    pending: ClientPending[str] = ClientPending()
    at_the_store = pending.offered(7)
    assert pending.add_waiter(7, "flush") is False
    lock_failed = pending.offered(7)
    assert pending.add_waiter(7, "flush after both") is False
    assert pending.resolved(7, lock_failed) == []  # the lock failure, answered before the batch commits
    assert pending.pending(7) == 1
    assert pending.resolved(7, at_the_store) == ["flush", "flush after both"]
    assert pending.pending(7) == 0
    assert pending.add_waiter(7, "nothing pending") is True


def test_client_pending_tickets_resolved_in_any_order():
    pending: ClientPending[str] = ClientPending()
    tickets = [pending.offered(3) for _ in range(4)]
    assert pending.add_waiter(3, "all four") is False
    for ticket in (tickets[3], tickets[1], tickets[2]):
        assert pending.resolved(3, ticket) == []
    assert pending.pending(3) == 1
    assert pending.resolved(3, tickets[0]) == ["all four"]
    assert pending.pending(3) == 0
    assert pending.offered(3) == 0  # nothing outstanding: the tickets start again


def test_batches_in_flight_are_bounded_and_resolve_oldest_first() -> None:
    pipeline: AppendPipeline[str] = AppendPipeline(LockTable(-1, 64), 2, 1 << 20, max_in_flight=2)
    for name in "abcdefg":
        pipeline.offer(QueuedAppend(ord(name), -1, LockRequest(), 1, name))
    assert pipeline.poll() == []
    first, second = pipeline.take_batch(), None
    assert first is not None and [i.origin for i in first] == ["a", "b"]
    pipeline.poll()
    second = pipeline.take_batch()
    assert second is not None and [i.origin for i in second] == ["c", "d"]
    pipeline.poll()
    assert pipeline.take_batch() is None and pipeline.in_flight == 2  # the bound
    assert len(pipeline) == 7
    resolved = pipeline.committed(10)
    assert [(i.origin, t) for i, t in resolved.committed] == [("a", 10), ("b", 11)]
    third = pipeline.take_batch()
    assert third is not None and [i.origin for i in third] == ["e", "f"]
    resolved = pipeline.failed(12, 12)  # the second batch broke after its first append committed
    assert [(i.origin, t) for i, t in resolved.committed] == [("c", 12)]
    assert [i.origin for i in resolved.failed] == ["d"]
    assert len(pipeline) == 3 and pipeline.in_flight == 1


def test_an_append_whose_lock_is_in_any_in_flight_batch_waits_for_it() -> None:
    pipeline: AppendPipeline[str] = AppendPipeline(LockTable(-1, 64), 1, 1 << 20, max_in_flight=3)
    pipeline.offer(QueuedAppend(1, -1, LockRequest(write=(5,)), 1, "w5"))
    pipeline.offer(QueuedAppend(2, -1, LockRequest(write=(6,)), 1, "w6"))
    pipeline.poll()
    assert [i.origin for i in pipeline.take_batch() or []] == ["w5"]
    pipeline.poll()
    assert [i.origin for i in pipeline.take_batch() or []] == ["w6"]
    pipeline.offer(QueuedAppend(3, -1, LockRequest(read=(5,)), 1, "stale r5"))
    assert pipeline.poll() == [] and pipeline.take_batch() is None  # doomed by w5, whichever batch holds it
    resolved = pipeline.committed(0)  # w5 committed as transaction 0; w6 is still in flight
    assert [(item.origin, t) for item, t in resolved.lock_failures] == [("stale r5", 0)]
    pipeline.offer(QueuedAppend(4, 0, LockRequest(read=(5,)), 1, "fresh r5"))
    assert pipeline.poll() == []
    assert [i.origin for i in pipeline.take_batch() or []] == ["fresh r5"]
    assert pipeline.in_flight == 2


@dataclass
class _Ticketed:
    client_id: int
    ticket: int


def test_client_pending_resolves_a_batch_as_each_append_alone_would():
    """resolved_all (a batch at once, one step per run of a client's consecutive tickets) releases the same waiters,
    and leaves the same pending counts, as resolved() per append, whatever the order within and across batches
    (issue 24's rule: a waiter waits for every append offered before it)."""
    rng = random.Random(34)
    for _ in range(300):
        one, batched = ClientPending[str](), ClientPending[str]()
        offered: list[_Ticketed] = []
        waiter = 0
        for _ in range(rng.randrange(1, 40)):
            client = rng.randrange(4)
            for pending in (one, batched):
                ticket = pending.offered(client)
            offered.append(_Ticketed(client, ticket))
            if rng.random() < 0.3:
                waiter += 1
                assert one.add_waiter(client, f"w{waiter}") == batched.add_waiter(client, f"w{waiter}")
        if rng.random() < 0.3:  # mostly in order, as batches resolve; lock failures resolve out of order
            rng.shuffle(offered)
        while offered:
            size = rng.randrange(1, len(offered) + 1)
            batch, offered = offered[:size], offered[size:]
            alone = [w for a in batch for w in one.resolved(a.client_id, a.ticket)]
            assert sorted(batched.resolved_all(batch)) == sorted(alone)
            for client in range(4):
                assert batched.pending(client) == one.pending(client)
        assert all(batched.pending(client) == 0 for client in range(4))
        assert batched.add_waiter(0, "after all") is True


def test_a_stale_append_behind_an_in_flight_conflict_fails_at_once() -> None:
    p = pipeline()
    p.offer(item(1, "w0", write=[7]))
    p.poll()
    p.take_batch()
    p.committed(0)  # lock 7's last writer: transaction 0
    p.offer(item(1, "w1", hwm=0, write=[7]))
    p.poll()
    p.take_batch()  # in flight, holding lock 7
    p.offer(item(2, "fresh", hwm=0, write=[7]))  # doomed: w1's commit fails it
    p.offer(item(3, "stale", write=[7]))  # saw nothing of 0: fails whatever w1 does
    p.offer(item(2, "stale-same-client", read=[7]))  # after fresh (its client), and stale as well
    failures = p.poll()
    # issue 31: they waited for w1's store round trip (and those of the appends queued before them)
    assert [(i.origin, t) for i, t in failures] == [("stale", 0), ("stale-same-client", 0)]
    assert p.waiting == 0 and p.doomed == 1
    resolved = p.committed(1)  # w1 committed: fresh is answered with it
    assert [(i.origin, t) for i, t in resolved.lock_failures] == [("fresh", 1)] and p.doomed == 0


class _CountingLocks(LockTable):
    checks = 0

    def check(self, request: LockRequest, client_high_water_mark: int) -> int | None:
        self.checks += 1
        return super().check(request, client_high_water_mark)


def test_a_waiting_append_is_lock_checked_once_per_commit_not_once_per_poll() -> None:
    """Issue 31: every rescan (each batch taken, each batch resolved) checked every waiting append with locks again,
    though a check's answer changes only when a commit moves a lock's mark: 50 appends waiting behind an in-flight
    conflict, through 20 batches of unrelated appends, were checked 1,051 times; now 51, and 50 more at the commit."""
    locks = _CountingLocks(-1, 1)  # one slot: the waiters' lock 8 shares the holder's (not doomed: they wait)
    p: AppendPipeline[str] = AppendPipeline(locks, 100, 10_000, max_in_flight=30)
    p.offer(item(1, "holder", write=[7]))
    p.poll()
    p.take_batch()  # in flight, holding lock 7: the waiters below wait for its outcome
    for n in range(50):
        p.offer(item(100 + n, f"waiter{n}", write=[8]))
    p.poll()
    assert locks.checks == 51 and p.waiting == 50
    for n in range(20):  # unrelated appends come and go; nothing commits on lock 7
        p.offer(item(2, f"other{n}"))
        p.poll()
        assert names(p.take_batch()) == [f"other{n}"]
        assert p.poll() == []
    assert locks.checks == 51
    p.committed(0)  # the holder committed as 0: the waiters (high-water mark -1) all fail, checked once more
    assert len(p.poll()) == 50 and locks.checks == 101


def test_every_lock_of_a_resolved_append_is_recorded_and_released_whatever_the_mix_of_batches() -> None:
    """Batches with and without locks, several in flight, commits, partial failures and drops at random: once
    everything resolved nothing is in flight in the lock table, no append holds a lock, and every committed write or
    append lock carries its commit's mark (a batch without locks skips the per-append lock work: a miscount would
    leave a lock in flight or a commit unrecorded)."""
    for seed in range(30):
        rng = random.Random(seed)
        table = LockTable(-1, 997)
        p: AppendPipeline[str] = AppendPipeline(table, rng.choice([3, 10, 50]), 10_000, rng.choice([1, 2, 4]))
        committed: list[tuple[QueuedAppend[str], int]] = []
        next_id, offered = 0, 0
        for _ in range(60):
            for _ in range(rng.randrange(5)):
                offered += 1
                locked = rng.random() < 0.3
                w = (rng.randrange(10_000),) if locked and rng.random() < 0.7 else ()
                a = (rng.randrange(10_000),) if locked and not w else ()
                p.offer(item(rng.randrange(4), f"a{offered}", next_id - 1, write=w, append=a))
            p.poll()
            if rng.random() < 0.1:
                p.drop(lambda i: i.origin.endswith("7"))
            p.take_batch()
            if p.in_flight and rng.random() < 0.6:
                if rng.random() < 0.8:
                    resolved = p.committed(next_id)
                else:
                    resolved = p.failed(next_id, next_id + rng.randrange(3) - 1)
                committed += resolved.committed
                next_id += len(resolved.committed)
        while len(p):
            p.poll()
            p.take_batch()
            p.drop(lambda i: True)  # what waits is dropped (a closing partition); what is in flight resolves
            while p.in_flight:
                resolved = p.committed(next_id)
                committed += resolved.committed
                next_id += len(resolved.committed)
        assert table.num_in_flight == 0 and not p._holders
        for append, transaction_id in committed:
            for h in append.locks.recorded:
                assert table.lock_high_water_mark(LockRequest(read=(h,))) >= transaction_id


def test_a_quiet_partition_sends_at_once_and_a_busy_one_gathers_for_the_next_turn() -> None:
    """Group commit under load (issue 42's open loop): the batch that an offer to an idle store makes goes from the
    offer itself only while the partition is quiet. Once a batch held several client messages, or appends waited
    behind one, the next goes after the loop's next turn, so that the messages arriving together join it; a lone
    message's batch with nothing waiting behind it makes the partition quiet again."""
    p = pipeline()
    p.offer(item(1, "m1"))
    p.poll()
    assert p.pace() is Send.NOW  # a lone writer: no loop turn in its round
    p.take_batch()
    p.offer(item(2, "m2"))
    p.poll()
    assert p.pace() is Send.LATER  # a batch is in flight: its commit sends the next
    p.committed(0)  # with m2 waiting behind it: busy
    assert p.pace() is Send.NEXT_TURN
    assert names(p.take_batch()) == ["m2"]
    p.committed(1)  # one message's batch, nothing behind it: quiet again
    p.offer(item(3, "m3"))
    p.offer(item(3, "m3"))  # (one message's two appends)
    p.poll()
    assert p.pace() is Send.NOW
    p.take_batch()
    p.committed(2)
    for message in ("m4", "m5"):
        p.offer(item(4, message))
    p.poll()
    assert p.pace() is Send.NOW
    assert names(p.take_batch()) == ["m4", "m5"]
    p.committed(4)  # two messages in one batch: busy, though nothing waited behind it
    p.offer(item(5, "m6"))
    p.poll()
    assert p.pace() is Send.NEXT_TURN
    assert pipeline().pace() is Send.LATER  # nothing to send
